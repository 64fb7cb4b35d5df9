//! `skill.json` bytes → `Manifest::from_slice`, under three operator
//! maxima. Whatever comes out valid must obey every rule the type promises
//! (policy/src/manifest.rs); errors must format.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use policy::limits::DEFAULT_MAX_TIMEOUT;
use policy::{Manifest, ValidateOptions};
use serde_json::Value;

fn check(data: &[u8], max: Duration) {
    let opts = ValidateOptions { max_timeout: max };
    let m = match Manifest::from_slice(data, &opts) {
        Ok(m) => m,
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.is_empty());
            // The same bytes, parsed first, must fail the same way.
            if let Ok(v) = serde_json::from_slice::<Value>(data) {
                let again = Manifest::from_value(v, &opts).expect_err("from_value accepted it");
                assert_eq!(again.to_string(), shown);
            }
            return;
        }
    };

    ongrid_fuzz::check_manifest(&m, max);

    // Validation is a function of the JSON value: the parsed value gives
    // the same manifest.
    let v: Value = serde_json::from_slice(data).expect("valid manifest is valid JSON");
    assert_eq!(Manifest::from_value(v, &opts).expect("from_value refused it"), m);
}

fuzz_target!(|data: &[u8]| {
    check(data, DEFAULT_MAX_TIMEOUT);
    check(data, Duration::from_secs(1));
    check(data, Duration::from_secs(29));
});
