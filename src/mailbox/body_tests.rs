use super::*;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A one-shot HTTP server on a free loopback port: answers the first request with `head`
/// then `body`, then holds the connection open without ending the body, as a server that
/// sends more than it says (or never stops) would; the reader must stop by its own count.
pub(crate) async fn serve(head: String, body: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await;
        socket.write_all(head.as_bytes()).await.unwrap();
        let _ = socket.write_all(&body).await;
        // Never ends: a reader waiting for the end of the body would wait for ever.
        std::future::pending::<()>().await;
    });
    url
}

async fn get(url: &str) -> reqwest::Response {
    reqwest::Client::new().get(url).send().await.unwrap()
}

/// `url`'s body read with the cap [`CAP`]: it must stop at the cap within 10 s, not wait for
/// the end of the body.
async fn read_at_cap(url: &str) -> Result<Vec<u8>, MailboxError> {
    let mut response = get(url).await;
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        read_capped(&mut response, url, CAP, |_| false),
    )
    .await
    .expect("stopped at the cap, not at the end of the body")
}

const CAP: usize = 64 * 1024;

/// A chunked body (no length at all) that goes on past the cap: an `Oversized` error as soon
/// as the cap is passed, though the body never ends.
#[tokio::test]
async fn a_body_without_a_length_is_cut_at_the_cap() {
    let mut body = Vec::new();
    for _ in 0..3 {
        body.extend_from_slice(format!("{:x}\r\n", CAP / 2).as_bytes());
        body.extend(std::iter::repeat_n(b'x', CAP / 2));
        body.extend_from_slice(b"\r\n");
    }
    let url = serve(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
        body,
    )
    .await;
    let read = read_at_cap(&url).await;
    match read {
        Err(MailboxError::Oversized {
            at_least, limit, ..
        }) => {
            assert!(at_least > CAP as u64, "{at_least}");
            assert_eq!(limit, CAP as u64);
        }
        other => panic!("{other:?}"),
    }
}

/// A Content-Length far larger than what comes (a lie): nothing is sized by it, and the cap
/// is counted on the bytes that do come.
#[tokio::test]
async fn a_body_that_lies_in_its_length_is_cut_at_the_cap() {
    let url = serve(
        "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n".into(),
        vec![b'x'; CAP + 1],
    )
    .await;
    let read = read_at_cap(&url).await;
    let err = read.unwrap_err();
    assert!(
        err.to_string()
            .contains("is over the 65536 bytes cap: at least"),
        "{err}"
    );
}

/// A body of exactly the cap is read whole.
#[tokio::test]
async fn a_body_of_exactly_the_cap_is_read() {
    let url = serve(
        format!("HTTP/1.1 200 OK\r\nContent-Length: {CAP}\r\n\r\n"),
        vec![b'y'; CAP],
    )
    .await;
    let mut response = get(&url).await;
    let body = read_capped(&mut response, &url, CAP, |_| false)
        .await
        .unwrap();
    assert_eq!(body.len(), CAP);
}

/// An error answer's endless body: only its start is read.
#[tokio::test]
async fn an_error_answer_reads_only_the_start_of_its_body() {
    let url = serve(
        "HTTP/1.1 500 Oops\r\nContent-Length: 1099511627776\r\n\r\n".into(),
        vec![b'e'; 2 * ERROR_BODY],
    )
    .await;
    let response = get(&url).await;
    let err = tokio::time::timeout(std::time::Duration::from_secs(10), success(response, &url))
        .await
        .expect("not waiting for the end")
        .unwrap_err();
    assert!(
        matches!(err, MailboxError::Http { status: 500, .. }),
        "{err}"
    );
}

fn skim(limits: Limits, chunks: &[&[u8]]) -> Skimmed {
    let mut skimmer = Skimmer::new(limits);
    for chunk in chunks {
        if skimmer.feed(chunk).unwrap() == Fed::Cut {
            break;
        }
    }
    skimmer.finish().unwrap()
}

const SMALL: Limits = Limits {
    string: 10,
    kept: 1000,
    read: 1 << 20,
};

#[test]
fn a_document_under_the_caps_is_read_as_it_is() {
    let text = br#"{"a": [1, "two", {"k\"ey": "va\\lue\u00e9"}], "b": null, "c": true}"#;
    let limits = Limits {
        string: 20,
        ..SMALL
    };
    // Fed a byte at a time too: a chunk may end anywhere, in an escape or a key.
    let whole = skim(limits, &[text]);
    let bytes: Vec<&[u8]> = text.chunks(1).collect();
    let split = skim(limits, &bytes);
    let expected: Value = serde_json::from_slice(text).unwrap();
    assert_eq!(whole.value, expected);
    assert_eq!(split.value, expected);
    assert!(whole.elided.is_empty() && split.elided.is_empty());
}

/// A string over the cap is emptied and sized; the rest of its item and the items after it
/// are read as usual.
#[test]
fn a_string_over_the_cap_is_emptied_named_and_sized() {
    let text = br#"{"envelopes": [{"id": "a", "text": "short"}, {"id": "b", "text": "0123\"456789ABC", "from": "x"}, {"id": "c"}]}"#;
    for size in [1, 3, 7, text.len()] {
        let chunks: Vec<&[u8]> = text.chunks(size).collect();
        let mut skimmed = skim(SMALL, &chunks);
        assert_eq!(
            skimmed.elided,
            vec![Elided {
                pointer: "/envelopes/1/text".into(),
                bytes: 15,
                whole: true,
            }]
        );
        assert_eq!(skimmed.items_elided("/envelopes"), vec![(1, 15)]);
        let list = skimmed.list("/envelopes");
        assert_eq!(list[0], serde_json::json!({"id": "a", "text": "short"}));
        assert_eq!(list[1]["id"], "b");
        assert_eq!(list[1]["from"], "x", "read past the emptied string");
        assert_eq!(list[1]["text"], "");
        assert_eq!(list[1][OVERSIZED], 15);
        assert_eq!(list[2], serde_json::json!({"id": "c"}));
    }
}

/// An answer that goes on past `read` inside an emptied string is cut there, the string
/// sized "at least", the document closed.
#[test]
fn an_endless_string_is_cut_at_the_read_limit() {
    let limits = Limits { read: 100, ..SMALL };
    let mut skimmer = Skimmer::new(limits);
    assert_eq!(
        skimmer.feed(br#"[{"id": "a", "body": ""#).unwrap(),
        Fed::More
    );
    let mut fed = Fed::More;
    for _ in 0..100 {
        fed = skimmer.feed(b"xxxxxxxxxx").unwrap();
        if fed == Fed::Cut {
            break;
        }
    }
    assert_eq!(fed, Fed::Cut);
    let skimmed = skimmer.finish().unwrap();
    assert_eq!(skimmed.value, serde_json::json!([{"id": "a", "body": ""}]));
    assert!(!skimmed.elided[0].whole);
    assert!(skimmed.elided[0].bytes > 10);
    // Past `read` outside such a string: refused.
    let mut skimmer = Skimmer::new(limits);
    let mut result = Ok(Fed::More);
    for _ in 0..100 {
        result = skimmer.feed(b"[1,2,3,4],");
        if result.is_err() {
            break;
        }
    }
    assert!(matches!(result, Err(Over::Read(_))), "{result:?}");
}

/// A server cannot mark a message oversized itself.
#[test]
fn the_oversized_mark_is_never_the_servers() {
    let text = format!(r#"[{{"id": "a", "{OVERSIZED}": 5}}]"#);
    let limits = Limits {
        string: 30,
        ..SMALL
    };
    let mut skimmed = skim(limits, &[text.as_bytes()]);
    assert!(skimmed.list("")[0].get(OVERSIZED).is_none());
}

/// A document over the kept bytes, none of its strings over the string cap, is refused.
#[test]
fn a_document_over_the_kept_bytes_is_refused() {
    let mut skimmer = Skimmer::new(Limits { kept: 100, ..SMALL });
    let item = br#""0123456789","#;
    let mut result = skimmer.feed(b"[");
    for _ in 0..20 {
        result = skimmer.feed(item);
        if result.is_err() {
            break;
        }
    }
    assert!(
        matches!(result, Err(Over::Kept(n)) if n > 100),
        "{result:?}"
    );
}

/// A string past the spill size is kept whole under the cap, and emptied over it, fed in
/// chunks as a socket gives them.
#[test]
fn a_long_string_is_kept_under_the_cap_and_emptied_over_it() {
    let limits = Limits {
        string: 4 << 20,
        kept: 16 << 20,
        read: 1 << 30,
    };
    for (size, kept) in [(2 << 20, true), (5 << 20, false)] {
        let text = format!(r#"[{{"id": "a", "body": "{}", "n": 1}}]"#, "x".repeat(size));
        let chunks: Vec<&[u8]> = text.as_bytes().chunks(64 * 1024).collect();
        let mut skimmed = skim(limits, &chunks);
        let list = skimmed.list("");
        assert_eq!(list[0]["n"], 1);
        if kept {
            assert_eq!(list[0]["body"].as_str().unwrap().len(), size);
        } else {
            assert_eq!(list[0]["body"], "");
            assert_eq!(list[0][OVERSIZED], size as u64);
        }
    }
}
