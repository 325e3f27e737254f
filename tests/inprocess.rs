//! The whole daemon in-process (intake → dispatch → runner → outbox), driven through its
//! `Controls` instead of signals, over the test back-ends (the AMP broker and the ASMTP
//! operator of tests/hosts, real HTTP on loopback): a task is answered, and a revoked key on
//! either back-end is recorded as `auth_failed` while the other agents go on. No mail host.

mod support;

use std::time::Duration;

use aamp_bridge::config::LoadedConfig;
use aamp_bridge::daemon::{self, Controls, RunOptions};

/// Waits (on real time: the daemon's own clock runs) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + support::WAIT;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {:?}",
            support::WAIT
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_in_process_answers_and_records_revoked_keys_on_amp_and_asmtp() {
    let config_dir = support::ConfigDir::empty();
    let dir = &config_dir.dir;
    let broker = support::AmpBroker::start(&[]);
    // The operator knows @alice.coder by another token than the one the config gives it.
    let operator = support::AsmtpOperator::start(&["@alice.coder"], &[]);
    let (amp_url, asmtp_port, key) = (broker.url(), operator.port, broker.key.clone());
    let (coder, boss, locked) = (
        broker.register("coder").await,
        broker.register("boss").await,
        broker.register("locked").await,
    );
    config_dir.write_private("amp.key", &key);
    config_dir.write_private("revoked.key", "amk_revoked");
    config_dir.write_private("revoked.token", "tok_revoked");
    let text = format!(
        "state_dir = \"state\"\n\n\
         [mailboxes.coder]\nkind = \"amp\"\namp_url = \"{amp_url}\"\naddress = \"{}\"\nagent_id = \"{}\"\napi_key_file = \"amp.key\"\npoll_interval_secs = 1\n\n\
         [mailboxes.locked]\nkind = \"amp\"\namp_url = \"{amp_url}\"\naddress = \"{}\"\nagent_id = \"{}\"\napi_key_file = \"revoked.key\"\npoll_interval_secs = 1\n\n\
         [mailboxes.operator]\nkind = \"asmtp\"\nasmtp_url = \"http://127.0.0.1:{asmtp_port}\"\nhandle = \"@alice.coder\"\ntoken_file = \"revoked.token\"\npoll_interval_secs = 1\n\n\
         [[agents]]\nname = \"coder\"\nmailbox = \"coder\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n\n\
         [[agents]]\nname = \"locked\"\nmailbox = \"locked\"\nprofile = \"echo\"\nallow_from = [\"{}\"]\n\n\
         [[agents]]\nname = \"asmtp\"\nmailbox = \"operator\"\nprofile = \"echo\"\nallow_from = [\"@alice.*\"]\n",
        coder.1, coder.0, locked.1, locked.0, boss.1, boss.1
    );
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &text).unwrap();
    let config = LoadedConfig::load(&path).unwrap();
    let state = config.state_dir.clone();
    let controls = Controls::default();
    let running = tokio::spawn(daemon::run(
        config,
        RunOptions {
            json: false,
            agents: Vec::new(),
        },
        controls.clone(),
    ));

    let sent = broker.send(&boss, &coder.1, "Greet", "say hello").await;
    let reply = broker.replies_to(&sent, &coder.1).await;
    assert!(reply[0]["body"].as_str().unwrap().contains("say hello"));

    let link = |agent: &str| {
        std::fs::read_to_string(state.join("agents").join(agent).join("link.json"))
            .unwrap_or_default()
    };
    until("the revoked AMP key is recorded", || {
        link("locked").contains("auth_failed")
    })
    .await;
    until("the revoked ASMTP token is recorded", || {
        link("asmtp").contains("auth_failed")
    })
    .await;
    assert!(link("coder").contains("connected"), "{}", link("coder"));

    controls.stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the daemon stops")
        .unwrap()
        .expect("and ends without an error");
}
