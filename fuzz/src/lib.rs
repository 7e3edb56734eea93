//! Helpers shared by the fuzz targets in `fuzz_targets/`: small structured inputs built
//! with `arbitrary`, biased towards values the parsers accept so the engines behind them get
//! exercised, with a share of arbitrary (mostly invalid) text mixed in.

use arbitrary::{Result, Unstructured};

/// Labels that the name grammar accepts in every position (they start with a letter).
const LABELS: &[&str] = &[
    "a", "b", "east", "west", "web", "web-0", "hello", "loyalty", "svc", "tcp", "udp",
];

/// A DNS-label-like string: usually a valid RFC-1035 label (sometimes the longest one
/// allowed, 63 characters, so that names built from several of them reach the 253-character
/// limit), sometimes a label that starts with a digit, sometimes arbitrary text.
pub fn label(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=4 => (*u.choose(LABELS)?).to_owned(),
        5 | 6 => {
            // A long valid label: a letter, then letters, digits and inner dashes.
            let len = if u.arbitrary()? {
                63
            } else {
                u.int_in_range(1..=63usize)?
            };
            let fill = *u.choose(&['a', 'z', '0', '-'])?;
            let mut s = String::with_capacity(len);
            s.push('x');
            for i in 1..len {
                s.push(if i + 1 == len && fill == '-' {
                    'y'
                } else {
                    fill
                });
            }
            s
        }
        7 => format!("{}", u.int_in_range(0..=999u16)?),
        _ => u.arbitrary::<String>()?,
    })
}

/// A cluster id: one of a few short ones, or a [`label`].
pub fn cluster(u: &mut Unstructured<'_>) -> Result<String> {
    if u.ratio(3, 4)? {
        Ok((*u.choose(&["east", "west", "north", "c0", "0a"])?).to_owned())
    } else {
        label(u)
    }
}

/// Upper-cases some ASCII letters of `s` (names are case-insensitive).
pub fn mixed_case(u: &mut Unstructured<'_>, s: &str) -> Result<String> {
    let mask = u.arbitrary::<u64>()?;
    Ok(s.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect())
}

/// Whether every label of the domain name `name` (trailing dot optional) is 1 to 63
/// characters long and the name is at most 253 characters: what the DNS wire format can
/// carry.
pub fn wire_encodable(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.len() <= 253
        && (name.is_empty() || name.split('.').all(|l| !l.is_empty() && l.len() <= 63))
}
