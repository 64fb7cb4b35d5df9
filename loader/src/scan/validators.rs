//! The compiled args validators of a registry, kept in a bounded cache
//! (least recently used out). The scan compiles every schema (one that
//! does not compile is not registered) and leaves the last ones compiled
//! in its report's cache, which the registry snapshot takes over; a
//! validator dropped since is compiled again on its skill's next request.
//!
//! A compiled `jsonschema::Validator` takes ~1.6 KB; compiling one takes
//! ~13 µs against ~0.2 µs to use it. Holding one per skill for 10,000
//! skills cost 16 MB of skilld's resident memory, most of it for skills
//! nobody runs; holding the [`DEFAULT_CAPACITY`] most recently used keeps
//! the cached path for every skill in use and bounds the memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use policy::Schema;

/// How many compiled validators a registry keeps.
pub const DEFAULT_CAPACITY: usize = 512;

/// A compiled validator, shared by the requests using it.
pub type Compiled = Arc<jsonschema::Validator>;

/// Compiles `schema`.
///
/// # Errors
///
/// The compiler's message (an unknown `$ref`, a bad regex, a keyword of
/// the wrong type).
pub fn compile(schema: &Schema) -> Result<Compiled, String> {
    // Default features are off: no `$ref` is ever fetched from the
    // network or the file system.
    jsonschema::validator_for(&schema.to_value()).map(Arc::new).map_err(|e| e.to_string())
}

/// At most `capacity` compiled validators, keyed by the skill's slot in
/// its snapshot; the least recently used is dropped first.
pub struct ValidatorCache {
    capacity: usize,
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    tick: u64,
    map: HashMap<usize, (Compiled, u64)>,
}

impl fmt::Debug for ValidatorCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidatorCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl Default for ValidatorCache {
    /// An empty cache of [`DEFAULT_CAPACITY`].
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl ValidatorCache {
    /// An empty cache of at most `capacity` validators (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), inner: Mutex::new(Entries::default()) }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock cannot leave a half-written map
        // entry that matters: at worst a validator is compiled again.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many validators are held.
    pub fn len(&self) -> usize {
        self.entries().map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The validator of `slot`, compiled by `compile` when not held.
    ///
    /// # Errors
    ///
    /// What `compile` returns.
    pub fn get_or_compile(
        &self,
        slot: usize,
        compile: impl FnOnce() -> Result<Compiled, String>,
    ) -> Result<Compiled, String> {
        {
            let mut e = self.entries();
            e.tick += 1;
            let tick = e.tick;
            if let Some((v, used)) = e.map.get_mut(&slot) {
                *used = tick;
                return Ok(Arc::clone(v));
            }
        }
        // Compiled outside the lock: other skills' requests go on.
        let v = compile()?;
        self.insert(slot, Arc::clone(&v));
        Ok(v)
    }

    /// Holds `v` as the validator of `slot`, dropping the least recently
    /// used one when full.
    pub fn insert(&self, slot: usize, v: Compiled) {
        let mut e = self.entries();
        e.tick += 1;
        let tick = e.tick;
        if !e.map.contains_key(&slot) && e.map.len() >= self.capacity {
            let oldest = e.map.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k);
            if let Some(k) = oldest {
                e.map.remove(&k);
            }
        }
        e.map.insert(slot, (v, tick));
    }

    /// Whether `slot`'s validator is held.
    pub fn contains(&self, slot: usize) -> bool {
        self.entries().map.contains_key(&slot)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;

    fn schema() -> Schema {
        Schema::from_value(&json!({"type": "object"})).unwrap()
    }

    #[test]
    fn compiles_once_and_drops_the_least_recently_used() {
        let cache = ValidatorCache::new(2);
        let compiles = AtomicUsize::new(0);
        let get = |slot| {
            cache
                .get_or_compile(slot, || {
                    compiles.fetch_add(1, Ordering::SeqCst);
                    compile(&schema())
                })
                .unwrap()
        };
        get(0);
        get(1);
        get(0);
        assert_eq!(compiles.load(Ordering::SeqCst), 2);
        get(2); // drops 1, the least recently used
        assert!(cache.contains(0) && cache.contains(2) && !cache.contains(1));
        assert_eq!(cache.len(), 2);
        get(1);
        assert_eq!(compiles.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn a_schema_that_does_not_compile_is_an_error_and_not_held() {
        let cache = ValidatorCache::new(4);
        let bad = Schema::from_value(&json!({"properties": {"a": {"pattern": "("}}})).unwrap();
        assert!(cache.get_or_compile(0, || compile(&bad)).is_err());
        assert!(cache.is_empty());
    }
}
