//! RFC 3339 timestamps (`X-AAMP-Expires-At`, JMAP's `receivedAt`). Pure code.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; `None` for anything else.
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
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &t[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        // The fraction to nanoseconds: its first nine digits, padded.
        nanos = frac[..digits.min(9)]
            .bytes()
            .chain(std::iter::repeat(b'0'))
            .take(9)
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            sign * (rest.get(1..3)?.parse::<i64>().ok()? * 3600
                + rest.get(4..6)?.parse::<i64>().ok()? * 60)
        }
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec - offset;
    let whole = if secs >= 0 {
        Some(UNIX_EPOCH + Duration::from_secs(secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }?;
    whole.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time (milliseconds, UTC): for events and timelines.
pub fn format_utc_ms(time: SystemTime) -> String {
    let ms = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_millis())
        .unwrap_or(0);
    let whole = format_utc(time);
    format!("{}.{ms:03}Z", whole.trim_end_matches('Z'))
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time (whole seconds, UTC).
pub fn format_utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = super::rfc5322::civil_from_days(secs.div_euclid(86_400));
    let r = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        r / 3600,
        r % 3600 / 60,
        r % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
