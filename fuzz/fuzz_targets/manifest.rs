//! `skill.json` bytes → `Manifest::from_slice`, under three operator
//! maxima. Whatever comes out valid must obey every rule the type promises
//! (policy/src/manifest.rs); errors must format.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use policy::limits::DEFAULT_MAX_TIMEOUT;
use policy::{Manifest, ManifestError, ValidateOptions};
use serde_json::Value;

fn check(data: &[u8], max: Duration) {
    let opts = ValidateOptions { max_timeout: max };
    // What serde_json reads: a skill.json may start with a UTF-8 byte order
    // mark, which `from_slice` skips.
    let json = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let m = match Manifest::from_slice(data, &opts) {
        Ok(m) => m,
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.is_empty());
            // The same bytes, parsed first, must fail the same way; but a
            // `Value` cannot hold a key twice, nor the text a number was
            // written as (which the timeout's refusal quotes).
            if let Ok(v) = serde_json::from_slice::<Value>(json) {
                let again = Manifest::from_value(v, &opts);
                match &e {
                    ManifestError::DuplicateKey { .. } => {}
                    ManifestError::Invalid { field, .. }
                        if field == "$serde_json::private::RawValue" => {}
                    ManifestError::Invalid { field, .. } if field == "timeout_seconds" => {
                        let again = again.expect_err("from_value accepted it");
                        assert!(
                            matches!(&again, ManifestError::Invalid { field: f, .. } if f == field),
                            "{again} / {shown}"
                        );
                    }
                    _ => assert_eq!(again.expect_err("from_value accepted it").to_string(), shown),
                }
            }
            return;
        }
    };

    ongrid_fuzz::check_manifest(&m, max);

    // Validation is a function of the JSON value: the parsed value gives
    // the same manifest.
    let v: Value = serde_json::from_slice(json).expect("valid manifest is valid JSON");
    assert_eq!(Manifest::from_value(v, &opts).expect("from_value refused it"), m);
}

fuzz_target!(|data: &[u8]| {
    check(data, DEFAULT_MAX_TIMEOUT);
    check(data, Duration::from_secs(1));
    check(data, Duration::from_secs(29));
});
