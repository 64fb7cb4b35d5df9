//! The replay store: an approval is accepted once.
//!
//! In memory: the approvals used (by [`Verified::replay_key`], key id and
//! digest) until [`FORGET_AFTER`] past their expiry: an entry past its
//! expiry cannot verify again while the clock is right, and the margin
//! covers a clock set wrong forward and then corrected (the approval would
//! verify again once the clock is back). On disk: the audit database records every
//! approval used, in the same transaction as the run's row, under a
//! unique key ([`crate::daemon::audit`]); at start-up the daemon loads the ones not
//! yet expired ([`ReplayStore::preload`]), and a replay that memory missed
//! is still refused by the database's constraint. A restart does not
//! re-open the window.
//!
//! Two requests racing with the same approvals: [`ReplayStore::reserve`]
//! checks and inserts under one lock, so exactly one wins. A reservation
//! that is not kept (the run was refused before anything was recorded)
//! is released when dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use policy::approval::Verified;

/// How long past its expiry a used approval is still remembered (memory
/// and database): a day.
pub const FORGET_AFTER: u64 = 86_400;

/// The approvals used, until [`FORGET_AFTER`] past their expiry.
#[derive(Debug, Default)]
pub struct ReplayStore {
    used: Mutex<HashMap<String, u64>>,
}

/// Approvals reserved for one run; released on drop unless kept.
#[derive(Debug)]
pub struct Reservation {
    store: Arc<ReplayStore>,
    keys: Vec<String>,
    kept: bool,
}

impl Reservation {
    /// The run was recorded (or is going ahead): the approvals stay used.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.kept {
            let mut used = self.store.used.lock().unwrap_or_else(PoisonError::into_inner);
            for k in &self.keys {
                used.remove(k);
            }
        }
    }
}

impl ReplayStore {
    /// Adds approvals known to be used (from the audit database).
    pub fn preload(&self, used: impl IntoIterator<Item = (String, u64)>) {
        let mut map = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        map.extend(used);
    }

    /// How many approvals are remembered.
    pub fn len(&self) -> usize {
        self.used.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Returns true if and only if no approval is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reserves `approvals` at `now` (unix seconds).
    ///
    /// # Errors
    ///
    /// The key id of the first approval already used.
    pub fn reserve(
        self: &Arc<Self>,
        approvals: &[Verified],
        now: u64,
    ) -> Result<Reservation, String> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.retain(|_, expires| expires.saturating_add(FORGET_AFTER) >= now);
        if let Some(v) = approvals.iter().find(|v| used.contains_key(&v.replay_key())) {
            return Err(v.key_id.clone());
        }
        let keys: Vec<String> = approvals.iter().map(Verified::replay_key).collect();
        for (k, v) in keys.iter().zip(approvals) {
            used.insert(k.clone(), v.expires_at);
        }
        Ok(Reservation { store: Arc::clone(self), keys, kept: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(key: &str, digest: &str, expires_at: u64) -> Verified {
        Verified { approver: key.into(), key_id: key.into(), expires_at, digest: digest.into() }
    }

    #[test]
    fn once_only_released_if_not_kept_and_forgotten_after_expiry() {
        let store = Arc::new(ReplayStore::default());
        let pair = [v("a", "d1", 100), v("b", "d1", 100)];
        let r = store.reserve(&pair, 10).unwrap();
        assert_eq!(store.reserve(&[v("b", "d1", 100)], 10).unwrap_err(), "b");
        drop(r);
        assert!(store.is_empty());
        store.reserve(&pair, 10).unwrap().keep();
        assert_eq!(store.reserve(&pair, 50).unwrap_err(), "a");
        // Another request signed by the same keys is another approval.
        assert!(store.reserve(&[v("a", "d2", 100)], 50).is_ok());
        assert_eq!(store.len(), 2);
        // Past expiry, within the margin: still refused (a clock corrected
        // back after a jump forward).
        store.reserve(&[], 101).unwrap().keep();
        assert_eq!(store.len(), 2);
        assert_eq!(store.reserve(&pair, 60).unwrap_err(), "a");
        store.reserve(&[], 101 + FORGET_AFTER).unwrap().keep();
        assert!(store.is_empty());
        store.preload([("a:d9".to_owned(), 500)]);
        assert!(store.reserve(&[v("a", "d9", 500)], 200).is_err());
    }
}
