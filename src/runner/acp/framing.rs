//! Line framing of the ACP connection over the agent's stdio, with a length cap.

use super::*;

/// Outgoing JSON-RPC messages, one per line.
pub(super) fn line_sink(
    stdin: ChildStdin,
) -> impl futures::Sink<String, Error = std::io::Error> + Send + 'static {
    futures::sink::unfold(stdin, async |mut stdin, line: String| {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    })
}

/// Incoming lines, each at most [`MAX_LINE`] bytes; a longer line is dropped whole.
pub(super) fn line_stream(
    stdout: ChildStdout,
) -> impl futures::Stream<Item = std::io::Result<String>> + Send + 'static {
    futures::stream::unfold(BufReader::new(stdout), async |mut reader| {
        next_line(&mut reader).await.map(|line| (line, reader))
    })
}

pub(super) async fn next_line(
    reader: &mut BufReader<ChildStdout>,
) -> Option<std::io::Result<String>> {
    let mut line = Vec::new();
    let mut skipping = false;
    loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(e) => return Some(Err(e)),
        };
        if buf.is_empty() {
            return (!line.is_empty() && !skipping)
                .then(|| Ok(String::from_utf8_lossy(&line).into_owned()));
        }
        let (take, newline) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if !skipping {
            if line.len() + take > MAX_LINE {
                skipping = true;
                line.clear();
            } else {
                line.extend_from_slice(&buf[..take]);
            }
        }
        reader.consume(take + usize::from(newline));
        if newline {
            if skipping {
                tracing::warn!(
                    limit = MAX_LINE,
                    "a line from the agent is too long; skipped"
                );
                skipping = false;
                continue;
            }
            return Some(Ok(String::from_utf8_lossy(&line).into_owned()));
        }
    }
}
