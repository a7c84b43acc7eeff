//! A budget of things in progress (handshakes, connections), in all and
//! by source address, as a pure core: what peers that open and never
//! finish can hold is bounded, and the per-address share keeps one
//! flooding host from taking what the others need. The coordinator's
//! handshakes and the metrics endpoint's connections both take from one;
//! [`Taken`] gives its share back when dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Things in progress, in all and by source address.
#[derive(Debug)]
pub struct AddressBudget {
    total_cap: usize,
    per_address_cap: usize,
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl AddressBudget {
    /// A budget of `total_cap` in all, at most `per_address_cap` from
    /// one address (each at least 1).
    pub fn new(total_cap: usize, per_address_cap: usize) -> Self {
        Self {
            total_cap: total_cap.max(1),
            per_address_cap: per_address_cap.max(1),
            total: 0,
            by_address: HashMap::new(),
        }
    }

    /// Takes one from `addr`, or says why not: the budget is spent
    /// in all, or by that address.
    pub fn try_take(&mut self, addr: IpAddr) -> Result<(), BudgetSpent> {
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

    /// One from `addr` ended.
    pub fn release(&mut self, addr: IpAddr) {
        if let Some(mine) = self.by_address.get_mut(&addr) {
            *mine -= 1;
            if *mine == 0 {
                self.by_address.remove(&addr);
            }
            self.total -= 1;
        }
    }

    /// In progress, in all.
    pub fn in_progress(&self) -> usize {
        self.total
    }
}

/// One taken from a shared [`AddressBudget`], given back when dropped.
#[derive(Debug)]
pub struct Taken {
    budget: Arc<Mutex<AddressBudget>>,
    addr: IpAddr,
}

impl Taken {
    /// Takes one from `addr` out of `budget`, held until the result drops.
    pub fn from(budget: &Arc<Mutex<AddressBudget>>, addr: IpAddr) -> Result<Self, BudgetSpent> {
        budget.lock().unwrap_or_else(|p| p.into_inner()).try_take(addr)?;
        Ok(Self { budget: budget.clone(), addr })
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.budget.lock().unwrap_or_else(|p| p.into_inner()).release(self.addr);
    }
}

/// Why nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSpent {
    /// This many are in progress in all.
    Total(usize),
    /// This many are in progress from the address.
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
        b.release(flood);
        b.try_take(IpAddr::from([10, 0, 2, 1])).unwrap();
        // Releasing an address with nothing in progress changes nothing.
        b.release("10.9.9.9".parse().unwrap());
        assert_eq!(b.in_progress(), 8);
        for _ in 0..2 {
            b.release(flood);
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
