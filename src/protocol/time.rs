//! RFC 3339 timestamps (`X-AAMP-Expires-At`, JMAP's `receivedAt`). Pure code; the calendar
//! is jiff's.

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::{civil::DateTime, tz::Offset, SignedDuration, Timestamp};

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; `None` for anything else. The shape is read
/// here rather than by jiff's parser, which also takes what peers never send and this parser
/// always refused (`+0100`, no seconds, `[zone]` annotations), and refuses a fraction longer
/// than nine digits, which this parser always cut to nine.
pub fn parse(text: &str) -> Option<SystemTime> {
    let t = text.trim();
    let b = t.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let two = |at: usize| i8::try_from(digits(&b[at..at + 2])?).ok();
    let second = two(17).filter(|s| *s <= 60)?;
    let (nanos, rest) = fraction(&t[19..])?;
    // A leap second (`:60`) is read as the first second of the next minute.
    let civil = DateTime::new(
        digits(&b[0..4])?,
        two(5)?,
        two(8)?,
        two(11)?,
        two(14)?,
        second.min(59),
        nanos,
    )
    .ok()?;
    let stamp = offset(rest)?.to_timestamp(civil).ok()?;
    let stamp = stamp
        .checked_add(SignedDuration::from_secs(i64::from(
            second - second.min(59),
        )))
        .ok()?;
    SystemTime::try_from(stamp).ok()
}

/// The value of a run of ASCII digits; `None` when a byte is not one.
fn digits(bytes: &[u8]) -> Option<i16> {
    bytes.iter().try_fold(0i16, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + i16::from(d - b'0'))
    })
}

/// An optional `.fraction` at the start of `rest`, as nanoseconds (its first nine digits,
/// padded), and what follows it.
fn fraction(rest: &str) -> Option<(i32, &str)> {
    let Some(frac) = rest.strip_prefix('.') else {
        return Some((0, rest));
    };
    let count = frac.bytes().take_while(u8::is_ascii_digit).count();
    if count == 0 {
        return None;
    }
    let nanos = frac[..count.min(9)]
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0i32, |n, d| n * 10 + i32::from(d - b'0'));
    Some((nanos, &frac[count..]))
}

/// `Z` or `±HH:MM`, and nothing after it.
fn offset(rest: &str) -> Option<Offset> {
    let b = rest.as_bytes();
    if matches!(rest, "Z" | "z") {
        return Some(Offset::UTC);
    }
    let sign = match b.first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if b.len() != 6 || b[3] != b':' {
        return None;
    }
    let minutes = i32::from(digits(&b[1..3])?) * 60 + i32::from(digits(&b[4..6])?);
    Offset::from_seconds(sign * minutes * 60).ok()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time (milliseconds, UTC): for events and timelines.
pub fn format_utc_ms(time: SystemTime) -> String {
    format!("{:.3}", timestamp(time))
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time (whole seconds, UTC).
pub fn format_utc(time: SystemTime) -> String {
    format!("{:.0}", timestamp(time))
}

/// jiff's timestamp for a time: a time before 1970 as 1970 (as these formats always wrote
/// it), one past jiff's year 9999 as its last instant.
pub(crate) fn timestamp(time: SystemTime) -> Timestamp {
    if time < UNIX_EPOCH {
        return Timestamp::UNIX_EPOCH;
    }
    Timestamp::try_from(time).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {

    #[test]
    fn fractions_of_a_second_are_kept() {
        let t = parse("2026-11-30T15:15:59.744Z").unwrap();
        let ms = t.duration_since(UNIX_EPOCH).unwrap().as_millis();
        assert_eq!(ms % 1000, 744);
        assert_eq!(format_utc_ms(t), "2026-11-30T15:15:59.744Z");
        let t = parse("2026-11-30T15:15:59.1234567891+00:00").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().subsec_nanos(),
            123_456_789
        );
    }

    use super::*;

    #[test]
    fn formats_what_it_parses() {
        let t = parse("2026-11-29T10:02:18Z").unwrap();
        assert_eq!(format_utc(t), "2026-11-29T10:02:18Z");
        assert_eq!(format_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn parses_rfc3339() {
        let t = parse("2026-11-29T10:02:18.123Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_795_946_538
        );
        assert_eq!(
            parse("2026-11-29T11:02:18+01:00"),
            parse("2026-11-29T10:02:18Z")
        );
        assert_eq!(
            parse("2000-02-29T00:00:00Z")
                .unwrap()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            951_782_400
        );
        for bad in [
            "",
            "tomorrow",
            "2026-13-01T00:00:00Z",
            "2026-11-29T10:02:18",
            "2026-11-29T10:02:18.Z",
            "2026-11-29T10:02:18+0100",
            "２０２６-11-29T10:02:18Z",
            "2026-11-29T1x:02:18Z",
            "2026-11-29T10:02:61Z",
            "2026-11-29T10:02:18+01",
            "2026-11-29T10:02Z",
            "2026-02-30T00:00:00Z",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn leap_seconds_and_milliseconds_are_read_as_before() {
        assert_eq!(parse("2016-12-31T23:59:60Z"), parse("2017-01-01T00:00:00Z"));
        let t = UNIX_EPOCH + std::time::Duration::from_nanos(1_795_946_538_999_999_999);
        assert_eq!(format_utc_ms(t), "2026-11-29T10:02:18.999Z");
        assert_eq!(format_utc(t), "2026-11-29T10:02:18Z");
        let before = UNIX_EPOCH - std::time::Duration::from_secs(5);
        assert_eq!(format_utc_ms(before), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse("2026-11-29 10:02:18z"), parse("2026-11-29T10:02:18Z"));
        assert_eq!(
            parse("2026-11-29t11:32:18+01:30"),
            parse("2026-11-29T10:02:18Z")
        );
    }
}
