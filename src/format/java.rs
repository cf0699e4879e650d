//! Java's `String.hashCode`, which RocketMQ uses for ConsumeQueue tags codes and
//! IndexFile key slots: `h = 31*h + c` over UTF-16 code units with 32-bit wrap.

/// Java `String.hashCode()` of `s` (UTF-16 code units, so non-BMP characters
/// contribute two surrogate units, exactly as in Java).
pub fn string_hash_code(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32))
}

/// The ConsumeQueue tags code of a message: the hash of the whole `TAGS` value,
/// sign-extended to 64 bits, or 0 when there are no tags.
pub fn tags_code(tags: Option<&str>) -> i64 {
    match tags {
        Some(t) if !t.is_empty() => string_hash_code(t) as i64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_java_values() {
        // Values computed by Java's String.hashCode.
        assert_eq!(string_hash_code(""), 0);
        assert_eq!(string_hash_code("a"), 97);
        assert_eq!(string_hash_code("TagA"), 2598919);
        assert_eq!(string_hash_code("hello world"), 1794106052);
        // Wraps like Java's int arithmetic.
        assert_eq!(string_hash_code("polygenelubricants"), i32::MIN);
        // A non-BMP character hashes as its two surrogates.
        let s = "\u{1F600}";
        let expected = (0xD83Di32).wrapping_mul(31).wrapping_add(0xDE00);
        assert_eq!(string_hash_code(s), expected);
    }

    #[test]
    fn tags_code_is_zero_without_tags() {
        assert_eq!(tags_code(None), 0);
        assert_eq!(tags_code(Some("")), 0);
        assert_eq!(tags_code(Some("a")), 97);
        assert_eq!(tags_code(Some("polygenelubricants")), i32::MIN as i64);
    }
}
