//! A budget of things in progress (handshakes, connections, requests), in
//! all and by key (a source address, a certificate's identity), as a pure
//! core: what peers that open and never finish can hold is bounded, and
//! the per-key share keeps one flooding host or certificate from taking
//! what the others need. The coordinator's handshakes and the metrics
//! endpoint's connections take from an [`AddressBudget`], the
//! coordinator's API requests from a budget by identity; [`Taken`] gives
//! its share back when dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Things in progress, in all and by key.
#[derive(Debug)]
pub struct Budget<K> {
    total_cap: usize,
    per_address_cap: usize,
    total: usize,
    by_address: HashMap<K, usize>,
}

/// Things in progress, in all and by source address.
pub type AddressBudget = Budget<IpAddr>;

impl<K: Hash + Eq + Clone> Budget<K> {
    /// A budget of `total_cap` in all, at most `per_address_cap` for
    /// one key (each at least 1).
    pub fn new(total_cap: usize, per_address_cap: usize) -> Self {
        Self {
            total_cap: total_cap.max(1),
            per_address_cap: per_address_cap.max(1),
            total: 0,
            by_address: HashMap::new(),
        }
    }

    /// Takes one for `addr`, or says why not: the budget is spent
    /// in all, or by that key.
    pub fn try_take(&mut self, addr: K) -> Result<(), BudgetSpent> {
        if self.total >= self.total_cap {
            return Err(BudgetSpent::Total(self.total));
        }
        let mine = self.by_address.entry(addr).or_insert(0);
        if *mine >= self.per_address_cap {
            return Err(BudgetSpent::Address(*mine));
        }
        *mine += 1;
        self.total += 1;
        Ok(())
    }

    /// One for `addr` ended.
    pub fn release(&mut self, addr: &K) {
        if let Some(mine) = self.by_address.get_mut(addr) {
            *mine -= 1;
            if *mine == 0 {
                self.by_address.remove(addr);
            }
            self.total -= 1;
        }
    }

    /// In progress, in all.
    pub fn in_progress(&self) -> usize {
        self.total
    }

    /// In progress for `key`.
    pub fn in_progress_of(&self, key: &K) -> usize {
        self.by_address.get(key).copied().unwrap_or(0)
    }
}

/// One taken from a shared [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Taken<K: Hash + Eq + Clone = IpAddr> {
    budget: Arc<Mutex<Budget<K>>>,
    addr: K,
}

impl<K: Hash + Eq + Clone> Taken<K> {
    /// Takes one for `addr` out of `budget`, held until the result drops.
    pub fn from(budget: &Arc<Mutex<Budget<K>>>, addr: K) -> Result<Self, BudgetSpent> {
        budget.lock().unwrap_or_else(|p| p.into_inner()).try_take(addr.clone())?;
        Ok(Self { budget: budget.clone(), addr })
    }
}

impl<K: Hash + Eq + Clone> Drop for Taken<K> {
    fn drop(&mut self) {
        self.budget.lock().unwrap_or_else(|p| p.into_inner()).release(&self.addr);
    }
}

/// Why nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSpent {
    /// This many are in progress in all.
    Total(usize),
    /// This many are in progress for the key (the address, the identity).
    Address(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_the_budget_of_the_others() {
        let (flood, node): (IpAddr, IpAddr) = ("10.0.0.66".parse().unwrap(), "10.0.0.4".parse().unwrap());
        let mut b = AddressBudget::new(8, 3);
        for _ in 0..3 {
            b.try_take(flood).unwrap();
        }
        assert_eq!(b.try_take(flood), Err(BudgetSpent::Address(3)));
        b.try_take(node).unwrap();
        for i in 0..4u8 {
            b.try_take(IpAddr::from([10, 0, 1, i])).unwrap();
        }
        assert_eq!(b.in_progress(), 8);
        assert_eq!(b.try_take(IpAddr::from([10, 0, 2, 1])), Err(BudgetSpent::Total(8)));
        b.release(&flood);
        b.try_take(IpAddr::from([10, 0, 2, 1])).unwrap();
        // Releasing an address with nothing in progress changes nothing.
        b.release(&"10.9.9.9".parse().unwrap());
        assert_eq!(b.in_progress(), 8);
        for _ in 0..2 {
            b.release(&flood);
        }
        assert_eq!(b.in_progress(), 6);
        b.try_take(flood).unwrap();
    }

    #[test]
    fn what_is_taken_is_given_back_when_dropped() {
        let budget = Arc::new(Mutex::new(AddressBudget::new(2, 1)));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let first = Taken::from(&budget, a).unwrap();
        assert_eq!(Taken::from(&budget, a).unwrap_err(), BudgetSpent::Address(1));
        drop(first);
        let _again = Taken::from(&budget, a).unwrap();
        assert_eq!(budget.lock().unwrap().in_progress(), 1);
    }
}
