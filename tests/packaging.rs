//! Issue 23: installing without a Rust toolchain. `scripts/package.sh` packages the built
//! binary (here the test build; `scripts/release.sh` does the same with the release one):
//! the `.deb` is installed into a root of its own with the real `dpkg` and removed again, and
//! the tarball's `install.sh` is run as a user who is not root.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 44: the manual installed whole (README.md, CONTRIBUTING.md, docs/ with its image), so
/// no link of an installed page points at a file that was left out.
fn assert_manual_installed(doc: &Path) {
    for file in [
        "README.md",
        "CONTRIBUTING.md",
        "docs/configuration.md",
        "docs/mailboxes/aamp.md",
        "docs/live-view.png",
    ] {
        assert!(doc.join(file).is_file(), "{file} is installed in {doc:?}");
    }
    let mut pages = vec![doc.join("README.md"), doc.join("CONTRIBUTING.md")];
    pages.extend(support::markdown_under(&doc.join("docs")));
    let broken: Vec<String> = pages
        .iter()
        .flat_map(|p| support::broken_links(p))
        .map(|b| b.to_string())
        .collect();
    assert!(
        broken.is_empty(),
        "installed manual:\n{}",
        broken.join("\n")
    );
}

/// The packages (the .deb, the tarball; SHA256SUMS beside them), built once for the tests
/// that install them: packaging the debug binary (compressed into both) took over a minute
/// of the suite each time, and each test reads the packages without changing them.
fn package() -> &'static (PathBuf, PathBuf) {
    static BUILT: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("packages");
        let _ = std::fs::remove_dir_all(&out);
        let listed = run(Command::new("bash")
            .arg(support::repo().join("scripts/package.sh"))
            .arg(support::bin())
            .arg(&out));
        let mut lines = listed.lines().map(PathBuf::from);
        (lines.next().unwrap(), lines.next().unwrap())
    })
}

#[test]
fn the_deb_installs_runs_and_removes_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let (deb, tarball) = package();
    let sums = std::fs::read_to_string(deb.with_file_name("SHA256SUMS")).unwrap();
    for file in [deb, tarball] {
        assert!(
            sums.contains(file.file_name().unwrap().to_str().unwrap()),
            "{sums}"
        );
    }
    let control = run(Command::new("dpkg-deb").arg("-f").arg(deb));
    assert!(control.contains("Package: aamp-bridge"), "{control}");
    assert!(control.contains("Depends: libc6 (>= 2."), "{control}");
    // Issue 33: Debian 11's nodejs (12) is too old for every agent and has no npm.
    assert!(!control.contains("Recommends:"), "{control}");
    let md5sums = run(Command::new("dpkg-deb").arg("-I").arg(deb).arg("md5sums"));
    assert!(md5sums.contains("usr/bin/aamp-bridge"), "{md5sums}");
    // Removing it stops the users' services (prerm) and clears their enable links (postrm):
    // scripts a POSIX shell reads.
    for script in ["prerm", "postrm"] {
        let text = run(Command::new("dpkg-deb").arg("-I").arg(deb).arg(script));
        assert!(text.contains("aamp-bridge.service"), "{script}: {text}");
        let file = work.path().join(script);
        std::fs::write(&file, &text).unwrap();
        run(Command::new("sh").arg("-n").arg(&file));
    }

    // A root of its own, so the test never touches the machine's packages.
    let root = work.path().join("root");
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .arg(format!("--admindir={}", admin.display()))
            .args([
                "--force-depends",
                "--force-not-root",
                "--force-script-chrootless",
            ])
            .args(args);
        c
    };
    run(dpkg(&["-i"]).arg(deb));
    let installed = root.join("usr/bin/aamp-bridge");
    assert!(run(Command::new(&installed).arg("--version")).starts_with("aamp-bridge "));
    for file in [
        "usr/share/man/man1/aamp-bridge.1.gz",
        "usr/share/bash-completion/completions/aamp-bridge",
        "usr/share/zsh/vendor-completions/_aamp-bridge",
        "usr/share/fish/vendor_completions.d/aamp-bridge.fish",
        "usr/share/aamp-bridge/profiles/claude.toml",
        "usr/share/doc/aamp-bridge/README.md",
        // Issue 43: the image the README links.
        "usr/share/doc/aamp-bridge/docs/live-view.png",
    ] {
        assert!(root.join(file).is_file(), "{file} is installed");
    }
    assert_manual_installed(&root.join("usr/share/doc/aamp-bridge"));
    // Issue 33: one man page per subcommand, as the top page names them.
    for page in [
        "aamp-bridge-start.1.gz",
        "aamp-bridge-profile-new.1.gz",
        "aamp-bridge-service-install.1.gz",
    ] {
        assert!(
            root.join("usr/share/man/man1").join(page).is_file(),
            "{page} is installed"
        );
    }
    // The man page renders.
    let page = run(Command::new("man")
        .arg("-l")
        .arg(root.join("usr/share/man/man1/aamp-bridge.1.gz"))
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "0"));
    assert!(page.contains("aamp-bridge"), "{page}");
    // The user unit is sound (checked with the installed binary in its ExecStart).
    let unit =
        std::fs::read_to_string(root.join("usr/lib/systemd/user/aamp-bridge.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/aamp-bridge start"),
        "{unit}"
    );
    let check = work.path().join("aamp-bridge.service");
    std::fs::write(
        &check,
        unit.replace("/usr/bin/aamp-bridge", installed.to_str().unwrap()),
    )
    .unwrap();
    let runtime = work.path().join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    run(Command::new("systemd-analyze")
        .args(["verify", "--user"])
        .arg(&check)
        .env("XDG_RUNTIME_DIR", &runtime));
    // And what `service render` writes for a user's own config.
    let config = work.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let rendered = run(Command::new(&installed).args([
        "--config",
        config.to_str().unwrap(),
        "service",
        "render",
    ]));
    assert!(rendered.contains("ExecStart="), "{rendered}");

    run(&mut dpkg(&["-r", "aamp-bridge"]));
    assert!(!installed.exists(), "removed");
    assert!(!root.join("usr/share/man/man1/aamp-bridge.1.gz").exists());
}

#[test]
fn the_tarball_installs_without_root_and_refuses_a_changed_file() {
    let work = tempfile::tempdir().unwrap();
    let (_, tarball) = package();
    let unpacked = work.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(&unpacked));
    let tree = std::fs::read_dir(&unpacked)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let prefix = work.path().join("prefix");
    // As a user who is not root, when the tests run as root (as CI does).
    let as_user = |args: &[&str]| {
        let mut c = if nix::unistd::geteuid().is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "nobody", "--"]);
            c
        } else {
            Command::new("env")
        };
        c.args(args).env("HOME", work.path().join("home"));
        c
    };
    if nix::unistd::geteuid().is_root() {
        run(Command::new("chown")
            .args(["-R", "nobody"])
            .arg(work.path()));
    }
    let said = run(&mut as_user(&[
        "bash",
        tree.join("install.sh").to_str().unwrap(),
        "--prefix",
        prefix.to_str().unwrap(),
    ]));
    assert!(said.contains("next: aamp-bridge init"), "{said}");
    assert!(
        run(Command::new(prefix.join("bin/aamp-bridge")).arg("--version"))
            .starts_with("aamp-bridge ")
    );
    assert!(prefix.join("share/man/man1/aamp-bridge.1.gz").is_file());
    assert!(prefix
        .join("share/bash-completion/completions/aamp-bridge")
        .is_file());
    assert_manual_installed(&prefix.join("share/doc/aamp-bridge"));

    // A file changed after the checksums were made: nothing is installed.
    std::fs::write(tree.join("share/aamp-bridge/profiles/echo.toml"), "changed").unwrap();
    let again = work.path().join("again");
    let out = as_user(&[
        "bash",
        tree.join("install.sh").to_str().unwrap(),
        "--prefix",
        again.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("do not match SHA256SUMS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!again.join("bin/aamp-bridge").exists());
}

/// Issue 33, item 3: bash completed only the first word (the generator read each
/// subcommand's case under another name than it set), and fish before 3.2 refused the
/// script's option spec. In a real bash: a subcommand's flags complete.
#[test]
fn bash_completes_a_subcommands_flags_and_the_fish_script_suits_old_fish() {
    let script = run(Command::new(env!("CARGO_BIN_EXE_aamp-bridge")).args(["completions", "bash"]));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aamp-bridge.bash");
    std::fs::write(&file, script).unwrap();
    let complete = |words: &str| {
        run(Command::new("bash").arg("-c").arg(format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _aamp__bridge aamp-bridge \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display()
        )))
    };
    let start = complete("aamp-bridge start --");
    assert!(start.lines().any(|l| l == "--agent"), "{start}");
    let new = complete("aamp-bridge profile new x --e");
    assert!(new.lines().any(|l| l == "--env"), "{new}");
    let fish = run(Command::new(env!("CARGO_BIN_EXE_aamp-bridge")).args(["completions", "fish"]));
    let specs: Vec<&str> = fish
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("string join \\n "))
        .flat_map(|l| l.split(' '))
        .collect();
    assert!(!specs.is_empty(), "{fish}");
    for spec in specs {
        let name = spec.trim_end_matches('=');
        // fish 3.1 takes `x`, `x/long` and `x-long`, never a bare long name.
        assert!(
            name.chars().count() == 1 || matches!(name.chars().nth(1), Some('/' | '-')),
            "{spec} in {fish}"
        );
    }
}

/// Issue 33: the release's source tarball carries what `scripts/test.sh` needs (the tests,
/// their hosts, agents and fixtures, the scripts, the fuzz targets), not the crate alone.
#[test]
fn the_source_tarball_carries_the_tests_and_scripts() {
    let out = tempfile::tempdir().unwrap();
    let made = run(Command::new("bash")
        .arg("scripts/source-tarball.sh")
        .arg(out.path())
        .current_dir(env!("CARGO_MANIFEST_DIR")));
    let tarball = PathBuf::from(made.trim());
    let name = tarball.file_name().unwrap().to_str().unwrap().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(name, format!("aamp-bridge-{version}-src.tar.gz"));
    let list = run(Command::new("tar").arg("tzf").arg(&tarball));
    let prefix = format!("aamp-bridge-{version}/");
    for file in [
        "Cargo.lock",
        "README.md",
        "CONTRIBUTING.md",
        "docs/configuration.md",
        "docs/live-view.png",
        ".ci/run",
        "scripts/test.sh",
        "scripts/mailhost.sh",
        "scripts/test-agents.sh",
        "tests/e2e.rs",
        "tests/support/mod.rs",
        "tests/hosts/aamp_host.py",
        "tests/fixtures/streams/qwen-no-auth.jsonl",
        "fuzz/Cargo.toml",
        "fuzz/fuzz_targets/parse_mail.rs",
    ] {
        assert!(
            list.lines().any(|l| l == format!("{prefix}{file}")),
            "{file} is in the source tarball"
        );
    }
    assert!(!list.contains("/target/"), "no build output");
}

/// Stand-ins for what `prerm` asks of the machine, in `dir`: one logged-in user (this one)
/// whose systemd shows the ExecStart of `$HOME/.config/systemd/user/aamp-bridge.service`
/// with `%h` expanded, as systemd does; `disable` is written to `log`.
fn prerm_stand_ins(dir: &Path, home: &Path, log: &Path) {
    let uid = nix::unistd::getuid();
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    let scripts = [
        (
            "loginctl",
            format!(
                "#!/bin/sh\ncase \"$1\" in\n  list-users) echo \"{uid} someone\" ;;\n  show-user) echo \"{}\" ;;\nesac\n",
                runtime.display()
            ),
        ),
        // runuser -u USER -- COMMAND...: runs COMMAND here.
        (
            "runuser",
            "#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n".to_string(),
        ),
        (
            "systemctl",
            format!(
                "#!/bin/sh\nunit=\"{home}/.config/systemd/user/aamp-bridge.service\"\ncase \" $* \" in\n  *\" show \"*)\n    line=$(sed -n 's/^ExecStart=//p' \"$unit\" | sed \"s|%h|{home}|g\")\n    set -- $line\n    echo \"{{ path=$1 ; argv[]=$line ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }}\" ;;\n  *\" disable \"*) echo \"$*\" >> \"{log}\" ;;\nesac\n",
                home = home.display(),
                log = log.display()
            ),
        ),
    ];
    for (name, text) in scripts {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        run(Command::new("chmod").arg("755").arg(&file));
    }
}

/// Issue 43: `apt-get remove aamp-bridge` stopped and disabled every logged-in user's
/// `aamp-bridge.service`, also one that runs the tarball's binary. `prerm` touches only a
/// unit that runs /usr/bin/aamp-bridge.
#[test]
fn prerm_leaves_a_unit_of_another_binary_alone() {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let units = home.join(".config/systemd/user");
    std::fs::create_dir_all(&units).unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = work.path().join("systemctl.log");
    prerm_stand_ins(&bin, &home, &log);
    let prerm = support::repo().join("packaging/debian/prerm");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let remove = || {
        run(Command::new("sh")
            .arg(&prerm)
            .arg("remove")
            .env("PATH", &path))
    };
    // The tarball's unit: left running.
    std::fs::write(
        units.join("aamp-bridge.service"),
        "[Service]\nExecStart=%h/.local/bin/aamp-bridge start\n",
    )
    .unwrap();
    remove();
    assert!(!log.exists(), "{:?}", std::fs::read_to_string(&log));
    // The package's: stopped and disabled.
    std::fs::write(
        units.join("aamp-bridge.service"),
        "[Service]\nExecStart=/usr/bin/aamp-bridge start\n",
    )
    .unwrap();
    remove();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("--user disable --now aamp-bridge.service"),
        "{said}"
    );
}

/// Issue 43: on a system whose glibc is older than the binary needs, `install.sh` installed a
/// binary that cannot start and said it succeeded. It runs the binary first and refuses with
/// the reason, writing nothing.
#[test]
fn install_sh_refuses_a_binary_that_cannot_run_here() {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::copy(
        support::repo().join("scripts/install.sh"),
        tree.join("install.sh"),
    )
    .unwrap();
    std::fs::write(
        tree.join("bin/aamp-bridge"),
        "#!/bin/sh\necho \"bin/aamp-bridge: /lib/x86_64-linux-gnu/libc.so.6: version \\`GLIBC_2.99' not found (required by bin/aamp-bridge)\" >&2\nexit 1\n",
    )
    .unwrap();
    run(Command::new("chmod")
        .arg("755")
        .arg(tree.join("bin/aamp-bridge")));
    run(Command::new("sh")
        .arg("-c")
        .arg("sha256sum bin/aamp-bridge > SHA256SUMS")
        .current_dir(&tree));
    let prefix = work.path().join("prefix");
    let out = Command::new("bash")
        .arg(tree.join("install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .env("HOME", work.path().join("home"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("does not run on this system") && stderr.contains("needs glibc 2.99"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("installed"));
    assert!(!prefix.exists(), "nothing is written");
}

/// Issue 43: `service status` called the tarball's own unit (`ExecStart=%h/.local/bin/...
/// start`) "another binary" and "another config": systemd expands `%h`, and no `--config`
/// is the default config.
#[test]
fn service_status_accepts_the_tarballs_own_unit() {
    let work = tempfile::tempdir().unwrap();
    let (_, tarball) = package();
    let unpacked = work.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(&unpacked));
    let tree = std::fs::read_dir(&unpacked)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let home = work.path().join("home");
    std::fs::create_dir_all(home.join(".config/aamp-bridge")).unwrap();
    std::fs::write(home.join(".config/aamp-bridge/config.toml"), "").unwrap();
    run(Command::new("bash")
        .arg(tree.join("install.sh"))
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME"));
    let unit =
        std::fs::read_to_string(home.join(".config/systemd/user/aamp-bridge.service")).unwrap();
    assert!(unit.contains("%h/.local/bin/aamp-bridge"), "{unit}");
    let out = Command::new(home.join(".local/bin/aamp-bridge"))
        .args(["service", "status", "--json"])
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let problems = status["problems"].to_string();
    assert!(
        !problems.contains("another") && !problems.contains("differs"),
        "{status}"
    );
}
