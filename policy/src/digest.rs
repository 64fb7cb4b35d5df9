//! [`ManifestDigest`]: the SHA-256 of a manifest file's bytes.
//!
//! The loader validates a manifest (name, schema, timeout, class) when it
//! scans it and checks each run's args against that reading; the executor
//! reads the file again for the run. The loader sends the digest of the
//! bytes it read with each run, and the executor refuses a run whose
//! manifest's bytes no longer have it: a pack edited or swapped for
//! another between the loader's scan and the run is not run under the
//! loader's old reading (another skill's name in the audit, args its schema
//! refuses, approvals given for another skill).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// The SHA-256 of a manifest's bytes; its text form is 64 lowercase hex
/// digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ManifestDigest([u8; 32]);

impl ManifestDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        ManifestDigest(Sha256::digest(bytes).into())
    }
}

impl fmt::Display for ManifestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::approval::hex(&self.0))
    }
}

impl fmt::Debug for ManifestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManifestDigest({self})")
    }
}

/// A text that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a manifest digest is 64 hex digits")]
pub struct DigestError;

impl FromStr for ManifestDigest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, DigestError> {
        let digits = s.as_bytes();
        if digits.len() != 64 {
            return Err(DigestError);
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            let nibble = |c: u8| char::from(c).to_digit(16).ok_or(DigestError);
            *byte =
                u8::try_from(nibble(pair[0])? << 4 | nibble(pair[1])?).map_err(|_| DigestError)?;
        }
        Ok(ManifestDigest(out))
    }
}

impl Serialize for ManifestDigest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ManifestDigest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_bad_text_is_refused() {
        let d = ManifestDigest::of(b"abc");
        let text = d.to_string();
        assert_eq!(text, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(text.parse::<ManifestDigest>(), Ok(d));
        assert_eq!(text.to_uppercase().parse::<ManifestDigest>(), Ok(d));
        assert_ne!(ManifestDigest::of(b"abd"), d);
        for bad in
            ["", "ab", &text[1..], &format!("{text}0"), &text.replace('b', "g"), &"é".repeat(32)]
        {
            assert_eq!(bad.parse::<ManifestDigest>(), Err(DigestError), "{bad:?}");
        }
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<ManifestDigest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<ManifestDigest>("\"zz\"").is_err());
        assert!(serde_json::from_str::<ManifestDigest>("7").is_err());
    }
}
