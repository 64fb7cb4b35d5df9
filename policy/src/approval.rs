//! Dual-sign approvals for `dangerous` skills, as pure rules: the canonical
//! digest of a request, Ed25519 signing and verification, key ids.
//!
//! # What is signed
//!
//! An approver signs (Ed25519, RFC 8032, through `ed25519-dalek`) the
//! 32-byte [`digest`]: SHA-256 of the canonical JSON (object keys sorted by
//! their UTF-8 bytes, no whitespace, serde_json's string escaping, numbers
//! as written in the request: the skill reads the args' text, so the
//! signature covers their spelling) of
//!
//! ```json
//! {"args":{...},"context":"ongrid-skills approval v1","expires_at":1764000000,"session_id":"s-42","skill":"rotate_logs"}
//! ```
//!
//! `session_id` is `null` when the request has none. Changing the skill,
//! any argument, the session or the expiry changes the digest, so the
//! signature no longer verifies. The `context` string keeps these
//! signatures from meaning anything elsewhere.
//!
//! # The wire
//!
//! `{"key_id":"<16 hex>","expires_at":<unix seconds>,"signature":"<base64 of 64 bytes>"}`
//! plus an optional `"digest":"<64 hex>"`: the digest the approver signed.
//! The digest is only a diagnosis aid (`ongrid-skill approve` adds it): a
//! signature that does not verify is reported as
//! [`DenyReason::ApprovalMismatch`] when the approver signed another
//! request, and as [`DenyReason::ApprovalInvalidSignature`] otherwise. The
//! signature is always what decides.
//!
//! A key id is the first 16 hex digits of SHA-256 of the 32-byte public key
//! ([`key_id`]).
//!
//! # Checks ([`verify`]), in order, first failure wins
//!
//! at least two approvals; each well formed; its key id configured; no key
//! twice; not expired (`expires_at > now`); not too far ahead
//! (`expires_at <= now + max_ttl`); the signature verifies (strict
//! verification: no small-order keys, no malleable signatures). Replay (an
//! approval accepted once) needs state: the loader keeps it, keyed by
//! [`Verified::replay_key`] (key id and digest, so that a re-encoded
//! signature is still the same approval).

use std::fmt;

use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::args::Args;
use sha2::{Digest, Sha256};

use crate::permission::DenyReason;

/// The domain separation string inside every signed message.
pub const CONTEXT: &str = "ongrid-skills approval v1";
/// Default of `approval_max_ttl_seconds`.
pub const DEFAULT_MAX_TTL_SECONDS: u64 = 900;
/// Approvals needed for a `dangerous` run.
pub const REQUIRED_APPROVALS: usize = 2;
/// Most approvals one request may carry.
pub const MAX_APPROVALS: usize = 16;
/// Hex digits of a key id.
pub const KEY_ID_LEN: usize = 16;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// One approval as it travels in the execute body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// The approver key's id ([`key_id`]).
    pub key_id: String,
    /// Unix seconds after which the approval is void.
    pub expires_at: u64,
    /// Base64 of the 64-byte Ed25519 signature over [`digest`].
    pub signature: String,
    /// Hex of the digest the approver signed (optional, for diagnosis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// The request an approval is for.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The skill's name.
    pub skill: &'a str,
    /// The args object, as the skill will read it.
    pub args: &'a Args,
    /// The request's `session_id`.
    pub session_id: Option<&'a str>,
}

/// A configured approver: a name and an Ed25519 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct Approver {
    name: String,
    key: VerifyingKey,
    key_id: String,
}

impl fmt::Debug for Approver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approver").field("name", &self.name).field("key_id", &self.key_id).finish()
    }
}

/// Why a key does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not base64.
    #[error("not base64: {0}")]
    Base64(String),
    /// Not 32 bytes.
    #[error("{0} bytes, expected 32")]
    Length(usize),
    /// Not a valid Ed25519 public key (or a weak, small-order one).
    #[error("not a usable Ed25519 public key")]
    Invalid,
}

fn decode32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = B64.decode(text.trim()).map_err(|e| KeyError::Base64(e.to_string()))?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| KeyError::Length(bytes.len()))
}

impl Approver {
    /// An approver from its name and the base64 of its 32-byte public key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the key is not base64 of a usable public key.
    pub fn new(name: &str, public_key_base64: &str) -> Result<Self, KeyError> {
        let key = VerifyingKey::from_bytes(&decode32(public_key_base64)?)
            .map_err(|_| KeyError::Invalid)?;
        if key.is_weak() {
            return Err(KeyError::Invalid);
        }
        Ok(Self { name: name.to_owned(), key_id: key_id(key.as_bytes()), key })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The base64 public key.
    pub fn public_key(&self) -> String {
        B64.encode(self.key.as_bytes())
    }
}

/// An approver's private key (an Ed25519 seed). Never printed by `Debug`.
#[derive(Clone)]
pub struct SecretKey(SigningKey);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.key_id())
    }
}

impl SecretKey {
    /// The key of a 32-byte seed (the caller gets it from the OS's random
    /// source).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// Parses the key file format: the base64 seed on one line.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the text is not base64 of 32 bytes.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode32(text).map(Self::from_seed)
    }

    /// The key file format: the base64 seed.
    pub fn to_base64(&self) -> String {
        B64.encode(self.0.to_bytes())
    }

    /// The base64 public key (what `[[approvers]] public_key` wants).
    pub fn public_key(&self) -> String {
        B64.encode(self.0.verifying_key().as_bytes())
    }

    /// The key id.
    pub fn key_id(&self) -> String {
        key_id(self.0.verifying_key().as_bytes())
    }

    /// Signs an approval of `subject`, void after `expires_at`.
    pub fn approve(&self, subject: &Subject<'_>, expires_at: u64) -> Approval {
        let d = digest(subject, expires_at);
        let sig: Signature = self.0.sign(&d);
        Approval {
            key_id: self.key_id(),
            expires_at,
            signature: B64.encode(sig.to_bytes()),
            digest: Some(hex(&d)),
        }
    }
}

/// A checked approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The approver's name.
    pub approver: String,
    /// The key id.
    pub key_id: String,
    /// When it expires (unix seconds).
    pub expires_at: u64,
    /// Hex of the digest it signed.
    pub digest: String,
}

impl Verified {
    /// What identifies the approval for replay: `key_id:digest`.
    pub fn replay_key(&self) -> String {
        format!("{}:{}", self.key_id, self.digest)
    }
}

/// A refused set of approvals: the reason and a message naming the
/// approval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Rejected {
    /// The reason code.
    pub reason: DenyReason,
    /// What is wrong, for the caller.
    pub message: String,
}

fn rejected(reason: DenyReason, message: String) -> Rejected {
    Rejected { reason, message }
}

/// Checks `approvals` of `subject` against `approvers` at `now` (unix
/// seconds): see the module docs for the order.
///
/// # Errors
///
/// [`Rejected`] with the first failure.
pub fn verify(
    approvals: &[Approval],
    approvers: &[Approver],
    subject: &Subject<'_>,
    now: u64,
    max_ttl: u64,
) -> Result<Vec<Verified>, Rejected> {
    if approvals.len() < REQUIRED_APPROVALS {
        return Err(rejected(
            DenyReason::ApprovalsRequired,
            format!(
                "skill \"{}\" is dangerous: it needs {REQUIRED_APPROVALS} approvals from distinct \
                 approver keys, the request has {}",
                subject.skill,
                approvals.len()
            ),
        ));
    }
    if approvals.len() > MAX_APPROVALS {
        return Err(rejected(
            DenyReason::ApprovalMalformed,
            format!("{} approvals, at most {MAX_APPROVALS} are accepted", approvals.len()),
        ));
    }
    let mut out: Vec<Verified> = Vec::with_capacity(approvals.len());
    // Computed at the first signature to check, then reused.
    let mut args: Option<String> = None;
    for (i, a) in approvals.iter().enumerate() {
        let which = format!("approval {i} (key {})", short(&a.key_id));
        let Some(approver) = approvers.iter().find(|p| p.key_id == a.key_id) else {
            return Err(rejected(
                DenyReason::ApprovalUnknownKey,
                format!("{which}: no configured approver has this key id"),
            ));
        };
        if out.iter().any(|v| v.key_id == a.key_id) {
            return Err(rejected(
                DenyReason::ApprovalDuplicateKey,
                format!("{which}: the same key approved twice; two distinct keys are needed"),
            ));
        }
        if a.expires_at <= now {
            return Err(rejected(
                DenyReason::ApprovalExpired,
                format!("{which}: expired {} s ago", now - a.expires_at),
            ));
        }
        if a.expires_at - now > max_ttl {
            return Err(rejected(
                DenyReason::ApprovalTtlTooLong,
                format!("{which}: expires in {} s, the maximum is {max_ttl} s", a.expires_at - now),
            ));
        }
        let Some(sig) = B64
            .decode(a.signature.trim())
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b.as_slice()).ok())
        else {
            return Err(rejected(
                DenyReason::ApprovalMalformed,
                format!("{which}: signature is not base64 of 64 bytes"),
            ));
        };
        let args = args.get_or_insert_with(|| canonical_json(subject.args.raw()));
        let d = digest_with(args, subject, a.expires_at);
        let expected = hex(&d);
        if approver.key.verify_strict(&d, &Signature::from_bytes(&sig)).is_err() {
            let claimed = a.digest.as_deref().map(str::to_ascii_lowercase);
            return Err(match claimed {
                Some(c) if c != expected => rejected(
                    DenyReason::ApprovalMismatch,
                    format!(
                        "{which}: signed another request (digest {}, this request's is {}): \
                         skill, args, session_id or expires_at differ",
                        short(&c),
                        short(&expected)
                    ),
                ),
                _ => rejected(
                    DenyReason::ApprovalInvalidSignature,
                    format!("{which}: the signature does not verify with {}'s key", approver.name),
                ),
            });
        }
        out.push(Verified {
            approver: approver.name.clone(),
            key_id: a.key_id.clone(),
            expires_at: a.expires_at,
            digest: expected,
        });
    }
    Ok(out)
}

/// The first 16 characters of `s`, for messages.
fn short(s: &str) -> String {
    s.chars().take(KEY_ID_LEN).collect()
}

/// The key id of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8; 32]) -> String {
    let mut h = hex(&Sha256::digest(public_key));
    h.truncate(KEY_ID_LEN);
    h
}

/// The digest an approver signs: SHA-256 of [`signed_message`].
pub fn digest(subject: &Subject<'_>, expires_at: u64) -> [u8; 32] {
    digest_with(&canonical_json(subject.args.raw()), subject, expires_at)
}

/// [`digest`] with the args' canonical JSON computed already (once per
/// request, not once per approval).
fn digest_with(args: &str, subject: &Subject<'_>, expires_at: u64) -> [u8; 32] {
    Sha256::digest(message(args, subject, expires_at).as_bytes()).into()
}

/// The canonical JSON text whose SHA-256 is signed.
pub fn signed_message(subject: &Subject<'_>, expires_at: u64) -> String {
    message(&canonical_json(subject.args.raw()), subject, expires_at)
}

fn message(args: &str, subject: &Subject<'_>, expires_at: u64) -> String {
    // Members in the sorted order of their keys.
    let mut out = String::from("{\"args\":");
    out.push_str(args);
    out.push_str(",\"context\":");
    out.push_str(&Value::from(CONTEXT).to_string());
    out.push_str(",\"expires_at\":");
    out.push_str(&expires_at.to_string());
    out.push_str(",\"session_id\":");
    out.push_str(&Value::from(subject.session_id).to_string());
    out.push_str(",\"skill\":");
    out.push_str(&Value::from(subject.skill).to_string());
    out.push('}');
    out
}

pub use crate::canonical::canonical_json;

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {

    use super::*;

    const NOW: u64 = 1_764_000_000;

    fn keys() -> (SecretKey, SecretKey, SecretKey, Vec<Approver>) {
        let a = SecretKey::from_seed([1; 32]);
        let b = SecretKey::from_seed([2; 32]);
        let stranger = SecretKey::from_seed([3; 32]);
        let approvers = vec![
            Approver::new("alice", &a.public_key()).unwrap(),
            Approver::new("bob", &b.public_key()).unwrap(),
        ];
        (a, b, stranger, approvers)
    }

    fn subject(args: &Args) -> Subject<'_> {
        Subject { skill: "rotate_logs", args, session_id: Some("s-42") }
    }

    fn parse(text: &str) -> Args {
        Args::from_slice(text.as_bytes()).unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_whitespace() {
        let text = r#"{ "b": [1, {"z": null, "a": "\u00e9\n"}], "a": 1.5, "B": true }"#;
        assert_eq!(canonical_json(text), r#"{"B":true,"a":1.5,"b":[1,{"a":"é\n","z":null}]}"#);
        assert_eq!(canonical_json("{"), "null");
    }

    #[test]
    fn numbers_are_signed_as_written() {
        // Two integers that one f64 holds are still two requests: the
        // skill reads the text, so an approval of one is not of the other.
        let one = parse(r#"{"id": 12345678901234567890123}"#);
        let other = parse(r#"{"id": 12345678901234567890124}"#);
        assert_eq!(one.value(), other.value());
        assert_ne!(digest(&subject(&one), NOW), digest(&subject(&other), NOW));
        assert!(signed_message(&subject(&one), NOW).contains(r#"{"id":12345678901234567890123}"#));
        let spelled = parse(r#"{"n": 1E3, "m": 1.50}"#);
        assert!(signed_message(&subject(&spelled), NOW).contains(r#"{"m":1.50,"n":1E3}"#));
        // Key order and whitespace are not part of it.
        let x = parse(r#"{"b":1,"a":[true, null]}"#);
        let y = parse("{ \"a\" : [ true ,null ] ,\"b\":1 }");
        assert_eq!(digest(&subject(&x), NOW), digest(&subject(&y), NOW));
    }

    #[test]
    fn the_signed_message_is_fixed() {
        let args = parse(r#"{"older_than_days": 30}"#);
        assert_eq!(
            signed_message(&subject(&args), NOW),
            r#"{"args":{"older_than_days":30},"context":"ongrid-skills approval v1","expires_at":1764000000,"session_id":"s-42","skill":"rotate_logs"}"#
        );
        let none = Subject { session_id: None, ..subject(&args) };
        assert!(signed_message(&none, NOW).contains(r#""session_id":null"#));
    }

    #[test]
    fn two_distinct_keys_verify() {
        let (a, b, _, approvers) = keys();
        let args = parse(r#"{"older_than_days": 30}"#);
        let s = subject(&args);
        let got =
            verify(&[a.approve(&s, NOW + 600), b.approve(&s, NOW + 60)], &approvers, &s, NOW, 900)
                .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].approver, "alice");
        assert_eq!(got[1].key_id, b.key_id());
        assert_eq!(got[0].key_id.len(), KEY_ID_LEN);
        assert_ne!(got[0].replay_key(), got[1].replay_key());
    }

    #[test]
    fn every_rejection_has_its_reason() {
        let (a, b, stranger, approvers) = keys();
        let args = parse(r#"{"older_than_days": 30}"#);
        let s = subject(&args);
        let ok_a = a.approve(&s, NOW + 600);
        let ok_b = b.approve(&s, NOW + 600);
        let mut forged = ok_b.clone();
        let mut sig = B64.decode(&forged.signature).unwrap();
        sig[5] ^= 1;
        forged.signature = B64.encode(&sig);
        let mut forged_no_digest = forged.clone();
        forged_no_digest.digest = None;
        let mut stolen_id = stranger.approve(&s, NOW + 600);
        stolen_id.key_id = b.key_id();
        let other_args = parse(r#"{"older_than_days": 1}"#);
        let changed = b.approve(&subject(&other_args), NOW + 600);
        let mut bad_b64 = ok_b.clone();
        bad_b64.signature = "***".into();
        let mut extended = ok_b.clone();
        extended.expires_at += 1;
        let cases: Vec<(Vec<Approval>, DenyReason)> = vec![
            (vec![], DenyReason::ApprovalsRequired),
            (vec![ok_a.clone()], DenyReason::ApprovalsRequired),
            (vec![ok_a.clone(), forged], DenyReason::ApprovalInvalidSignature),
            (vec![ok_a.clone(), forged_no_digest], DenyReason::ApprovalInvalidSignature),
            (vec![ok_a.clone(), stolen_id], DenyReason::ApprovalInvalidSignature),
            (vec![ok_a.clone(), stranger.approve(&s, NOW + 600)], DenyReason::ApprovalUnknownKey),
            (vec![ok_a.clone(), a.approve(&s, NOW + 300)], DenyReason::ApprovalDuplicateKey),
            (vec![ok_a.clone(), b.approve(&s, NOW)], DenyReason::ApprovalExpired),
            (vec![ok_a.clone(), b.approve(&s, NOW + 901)], DenyReason::ApprovalTtlTooLong),
            (vec![ok_a.clone(), changed], DenyReason::ApprovalMismatch),
            (vec![ok_a.clone(), extended], DenyReason::ApprovalMismatch),
            (vec![ok_a.clone(), bad_b64], DenyReason::ApprovalMalformed),
            (vec![ok_a; 17], DenyReason::ApprovalMalformed),
        ];
        for (i, (approvals, want)) in cases.into_iter().enumerate() {
            let e = verify(&approvals, &approvers, &s, NOW, 900).unwrap_err();
            assert_eq!(e.reason, want, "case {i}: {e}");
            assert!(!e.message.is_empty());
        }
        // The edge of the window is accepted.
        assert!(verify(&[a.approve(&s, NOW + 900), ok_b], &approvers, &s, NOW, 900).is_ok());
    }

    #[test]
    fn keys_round_trip_and_bad_keys_are_refused() {
        let a = SecretKey::from_seed([9; 32]);
        let back = SecretKey::from_base64(&a.to_base64()).unwrap();
        assert_eq!(back.public_key(), a.public_key());
        assert!(!format!("{a:?}").contains(&a.to_base64()));
        assert_eq!(
            Approver::new("x", "%%").unwrap_err().to_string().split(':').next(),
            Some("not base64")
        );
        assert_eq!(Approver::new("x", &B64.encode([1u8; 31])), Err(KeyError::Length(31)));
        // The identity point is a weak key.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(Approver::new("x", &B64.encode(identity)), Err(KeyError::Invalid));
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
    }
}
