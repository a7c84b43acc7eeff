//! Hosts made of Linux network namespaces on one bridge, for runs that
//! must not share loopback (issue 14's two targets "on hosts made of
//! network namespaces"). Each host is a namespace with one veth into a
//! bridge in the root namespace, which has an address on the same subnet
//! (so commands run from the root namespace, and trainers, which reach
//! their node through its Unix socket, a file, work unchanged). A host is
//! cut off by taking its veth's root end down (`ip link set … down`),
//! which drops what crosses it, both ways, as a pulled cable does.
//!
//! Needs root and iproute2. Names carry a per-run prefix so parallel runs
//! do not collide, and everything is deleted on drop, also when a run
//! fails (../shared/research/multi-host-testing.md).

use anyhow::{Context, Result, bail};
use granary_testkit::harness::NetHost;
use std::net::Ipv4Addr;
use std::process::Command;

/// Hosts made of network namespaces; deleted on drop.
pub struct Hosts {
    bridge: String,
    /// The root end of each host's veth.
    links: Vec<String>,
    hosts: Vec<NetHost>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Hosts {
    /// Whether this process can make network namespaces (root and
    /// iproute2); the reason when not.
    pub fn available() -> Result<()> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            bail!("network namespaces need root");
        }
        // Made and deleted: root alone is not enough in a container
        // without the right to make namespaces.
        let probe = format!("grprobe{}", std::process::id());
        ip(&["netns", "add", &probe]).context("making a network namespace")?;
        ip(&["netns", "del", &probe]).context("deleting a network namespace")?;
        Ok(())
    }

    /// Creates `n` hosts (1 to 200) on a bridge, host i at 10.S.0.(i+1)/24
    /// and the bridge at 10.S.0.254, where S comes from the process id.
    pub fn create(n: usize) -> Result<Self> {
        Self::available()?;
        if n == 0 || n > 200 {
            bail!("{n} hosts: between 1 and 200");
        }
        let tag = std::process::id() % 10_000;
        let subnet = 100 + (std::process::id() % 100) as u8;
        let mut h = Self { bridge: format!("gr{tag}br"), links: Vec::new(), hosts: Vec::new() };
        ip(&["link", "add", &h.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("10.{subnet}.0.254/24"), "dev", &h.bridge])?;
        ip(&["link", "set", &h.bridge, "up"])?;
        for i in 0..n {
            let ns = format!("gr{tag}h{i}");
            let (outer, inner) = (format!("gr{tag}v{i}"), format!("gr{tag}e{i}"));
            let addr = Ipv4Addr::new(10, subnet, 0, i as u8 + 1);
            ip(&["netns", "add", &ns])?;
            // Recorded at once: a failure below still deletes it.
            h.hosts.push(NetHost { netns: ns.clone(), ip: addr });
            ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
            h.links.push(outer.clone());
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &h.bridge])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    /// The hosts, for [`granary_testkit::harness::LocalClusterSpec::hosts`].
    pub fn hosts(&self) -> &[NetHost] {
        &self.hosts
    }

    /// The root end of host `i`'s link (what [`Hosts::set_link`] takes
    /// down).
    pub fn link(&self, i: usize) -> Option<&str> {
        self.links.get(i).map(String::as_str)
    }

    /// Takes host `i`'s link down (`up` false: nothing crosses it, either
    /// way) or brings it back.
    pub fn set_link(&self, i: usize, up: bool) -> Result<()> {
        let Some(link) = self.link(i) else { bail!("no host {i}") };
        set_link(link, up)
    }
}

/// Takes a link down or brings it up (a free function, for a fault thread
/// that holds only the name).
pub fn set_link(link: &str, up: bool) -> Result<()> {
    ip(&["link", "set", link, if up { "up" } else { "down" }])
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them
        // their peers in the root namespace.
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.netns]);
        }
        for l in &self.links {
            let _ = ip(&["link", "del", l]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts are made, their links go down and up, and everything is
    /// removed on drop (skipped, saying so, without root). That they reach
    /// each other is shown by `granary-chaos hosts`, whose cluster forms
    /// across them (`chaos/tests/chaos_hosts.rs`).
    #[test]
    fn hosts_are_made_and_removed() {
        if let Err(e) = Hosts::available() {
            granary_testkit::skip::skipped(e);
            return;
        }
        let names: Vec<String>;
        {
            let h = Hosts::create(2).expect("hosts");
            names = h.hosts().iter().map(|x| x.netns.clone()).collect();
            let list = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
            assert!(names.iter().all(|n| list.contains(n.as_str())), "{list}");
            h.set_link(1, false).expect("down");
            h.set_link(1, true).expect("up");
        }
        let list = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
        assert!(names.iter().all(|n| !list.contains(n.as_str())), "removed on drop: {list}");
    }
}
