//! The voter's handshake budget, pure: how many QUIC handshakes may be in
//! progress at once, in all and from one address. A handshake holds no
//! connection slot until its certificate is checked; this budget bounds
//! what peers that start handshakes and never finish them (or show no
//! certificate) can hold, and the per-address share keeps one flooding
//! host from taking the budget the nodes' and voters' own handshakes need.

use std::collections::HashMap;
use std::net::IpAddr;

/// Handshakes in progress, in all and by source address.
#[derive(Debug)]
pub struct HandshakeBudget {
    total_cap: usize,
    per_address_cap: usize,
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl HandshakeBudget {
    /// A budget of `total_cap` handshakes, at most `per_address_cap` from
    /// one address (each at least 1).
    pub fn new(total_cap: usize, per_address_cap: usize) -> Self {
        Self {
            total_cap: total_cap.max(1),
            per_address_cap: per_address_cap.max(1),
            total: 0,
            by_address: HashMap::new(),
        }
    }

    /// Takes a handshake from `addr`, or says why not: the budget is spent
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

    /// A handshake from `addr` ended (finished, failed or timed out).
    pub fn release(&mut self, addr: IpAddr) {
        if let Some(mine) = self.by_address.get_mut(&addr) {
            *mine -= 1;
            if *mine == 0 {
                self.by_address.remove(&addr);
            }
            self.total -= 1;
        }
    }

    /// Handshakes in progress.
    pub fn in_progress(&self) -> usize {
        self.total
    }
}

/// Why a handshake was not taken.
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
        let mut b = HandshakeBudget::new(8, 3);
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
}
