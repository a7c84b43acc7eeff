//! The chaos run's coordinator client: while the faults fire, a few clients
//! register datasets under new names (`AddDataset`, a write) and list them
//! (`ListDatasets`, a read of the whole set), and record every call with its
//! answer. Afterwards, with every voter back, one last read; then
//! [`crate::lincheck`] judges the history against a grow-only set: no
//! acknowledged registration may be lost, and every read must fit one
//! order of the operations that respects real time.
//!
//! The names registered all point at one small dataset of their own (its
//! own prefix in the store), so nodes that open them read nothing and the
//! job's dataset is untouched. A call that fails is indeterminate: an add
//! may or may not have taken effect (a crashed op in the history); a read
//! that failed constrains nothing and is dropped.

use crate::lincheck::{self, GrowSet, Limits, Operation, SetInput, SetOutput, Verdict};
use anyhow::{Context, Result, anyhow};
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientOptions, CoordinatorClient};
use granary_net::tls::Identity;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Names the chaos client registers start with this.
pub const PREFIX: &str = "lin-";

type Op = Operation<SetInput<String>, SetOutput<String>>;

/// Running clients.
pub struct LinClients {
    client: CoordinatorClient,
    ops: Arc<Mutex<Vec<Op>>>,
    /// Each client's add in flight, as the crashed op it becomes if the
    /// client is stopped before the answer.
    in_flight: Arc<Mutex<BTreeMap<u64, Op>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    t0: Instant,
}

/// The chaos clients' sockets, bound ahead of them.
pub struct Endpoints(Vec<quinn::Endpoint>);

impl Endpoints {
    /// The addresses they send from.
    pub fn addrs(&self) -> Result<Vec<SocketAddr>> {
        self.0.iter().map(|e| e.local_addr().context("a chaos client's address")).collect()
    }
}

/// What the history showed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinReport {
    /// Operations recorded (failed reads dropped).
    pub ops: usize,
    /// Registrations acknowledged.
    pub acknowledged: usize,
    /// Calls that failed (indeterminate adds, dropped reads).
    pub failed: usize,
    /// `linearizable`, `not linearizable`, or `unknown` (the search hit its
    /// step bound).
    pub verdict: String,
    /// For a history that is not linearizable: why.
    pub detail: Option<String>,
}

fn micros(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

impl LinClients {
    /// Binds the sockets of `clients` clients and the last reader, on
    /// loopback, before a relay that must know their addresses starts
    /// ([`Endpoints::addrs`]). Must run inside a tokio runtime.
    pub fn bind(clients: u64) -> Result<Endpoints> {
        let any: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
        let eps = (0..=clients)
            .map(|_| granary_net::transport::endpoint(any, None).context("binding a chaos client's socket"))
            .collect::<Result<Vec<_>>>()?;
        Ok(Endpoints(eps))
    }

    /// Starts a client on each of `endpoints` but the last (which makes
    /// the last read), on the current runtime; they register `source`
    /// (read with `view`) under new names until [`Self::finish`].
    pub fn start(
        endpoints: Endpoints,
        certs: &Path,
        voters: Vec<SocketAddr>,
        seed: u64,
        source: String,
        view: granary_proto::View,
    ) -> Result<Self> {
        let identity = Identity::load(certs, "admin").map_err(|e| anyhow!("admin certificate: {e}"))?;
        let options = ClientOptions { deadline: Duration::from_secs(5), ..ClientOptions::default() };
        let connect = |ep: quinn::Endpoint| {
            CoordinatorClient::on_endpoint(ep, &identity, voters.clone(), options).context("coordinator client")
        };
        let mut eps = endpoints.0;
        let client = connect(eps.pop().context("no socket for the last read")?)?;
        let ops = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let tasks = (0u64..)
            .zip(eps)
            .map(|(id, ep)| {
                // A socket and connections of its own per client.
                let client = connect(ep)?;
                let (ops, in_flight, stop) = (ops.clone(), in_flight.clone(), stop.clone());
                let (source, view) = (source.clone(), view.clone());
                Ok(tokio::spawn(async move {
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let op = if k.is_multiple_of(2) {
                            let name = format!("{PREFIX}{seed}-{id}-{k}");
                            add(&client, id, &name, &source, &view, t0, &in_flight).await
                        } else {
                            read(&client, id, t0).await
                        };
                        if let Some(op) = op {
                            ops.lock().unwrap_or_else(PoisonError::into_inner).push(op);
                        }
                        k += 1;
                        tokio::time::sleep(Duration::from_millis(20 + 10 * id)).await;
                    }
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { client, ops, in_flight, stop, tasks, t0 })
    }

    /// Stops the clients (an op in flight is abandoned: a crashed op), makes
    /// one last read and checks the history.
    pub async fn finish(self) -> LinReport {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        // The last read: with every voter back, it must see every
        // acknowledged add.
        let mut last = None;
        for _ in 0..20 {
            last = read(&self.client, u64::MAX, self.t0).await;
            if last.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut ops = std::mem::take(&mut *self.ops.lock().unwrap_or_else(PoisonError::into_inner));
        // An add abandoned in flight may have been applied (seeds 6 and 7
        // once saw the last read hold a name no recorded op had added).
        ops.extend(std::mem::take(&mut *self.in_flight.lock().unwrap_or_else(PoisonError::into_inner)).into_values());
        let failed_before = ops.iter().filter(|o| matches!(o.outcome, lincheck::Outcome::Crashed)).count();
        let last_missing = last.is_none();
        ops.extend(last);
        judge(&ops, failed_before + usize::from(last_missing))
    }
}

/// Judges a recorded history.
pub fn judge(ops: &[Op], failed: usize) -> LinReport {
    let acknowledged = ops
        .iter()
        .filter(|o| matches!((&o.input, &o.outcome), (SetInput::Add(_), lincheck::Outcome::Returned { .. })))
        .count();
    let (verdict, detail) =
        match lincheck::check_with(&GrowSet::<String>::default(), ops, Limits { max_steps: 2_000_000 }) {
            Ok(Verdict::Linearizable) => ("linearizable".to_string(), None),
            Ok(Verdict::NotLinearizable(c)) => ("not linearizable".to_string(), Some(c.to_string())),
            Ok(Verdict::Unknown { .. }) => ("unknown".to_string(), None),
            Err(e) => ("not linearizable".to_string(), Some(format!("the history itself is malformed: {e}"))),
        };
    LinReport { ops: ops.len(), acknowledged, failed, verdict, detail }
}

async fn add(
    client: &CoordinatorClient,
    id: u64,
    name: &str,
    source: &str,
    view: &granary_proto::View,
    t0: Instant,
    in_flight: &Mutex<BTreeMap<u64, Op>>,
) -> Option<Op> {
    let input = SetInput::Add(name.to_string());
    let call = micros(t0);
    let pending = |m: &Mutex<BTreeMap<u64, Op>>| m.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    in_flight.lock().unwrap_or_else(PoisonError::into_inner).insert(id, Operation::crashed(id, input.clone(), call));
    let req = ApiRequest::AddDataset {
        name: name.to_string(),
        source: source.to_string(),
        view: view.clone(),
        progress: false,
    };
    let answer = client.call(&req).await;
    // Answered: no longer in flight (the caller records the op at once;
    // `finish` aborts a client only at an await, never between the two).
    pending(in_flight);
    Some(match answer {
        Ok((_, ApiResponse::DatasetAdded { .. })) => Operation::returned(id, input, call, micros(t0), SetOutput::Added),
        // Refused or failed: it may still have been applied.
        _ => Operation::crashed(id, input, call),
    })
}

async fn read(client: &CoordinatorClient, id: u64, t0: Instant) -> Option<Op> {
    let call = micros(t0);
    match client.call(&ApiRequest::ListDatasets).await {
        Ok((_, ApiResponse::Datasets(list))) => {
            let names: BTreeSet<String> = list.into_iter().map(|d| d.name).filter(|n| n.starts_with(PREFIX)).collect();
            Some(Operation::returned(id, SetInput::ReadAll, call, micros(t0), SetOutput::All(names)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(names: &[&str]) -> SetOutput<String> {
        SetOutput::All(names.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn a_lost_acknowledged_add_is_not_linearizable_and_an_unanswered_one_may_go_either_way() {
        let add = |n: &str| SetInput::Add(n.to_string());
        let ok = vec![
            Operation::returned(0, add("lin-a"), 0, 10, SetOutput::Added),
            Operation::crashed(1, add("lin-b"), 5),
            Operation::returned(0, SetInput::ReadAll, 20, 30, all(&["lin-a"])),
            Operation::returned(1, SetInput::ReadAll, 40, 50, all(&["lin-a", "lin-b"])),
        ];
        let r = judge(&ok, 1);
        assert_eq!((r.verdict.as_str(), r.acknowledged, r.ops), ("linearizable", 1, 4));
        let lost = vec![
            Operation::returned(0, add("lin-a"), 0, 10, SetOutput::Added),
            Operation::returned(1, SetInput::ReadAll, 20, 30, all(&[])),
        ];
        let r = judge(&lost, 0);
        assert_eq!(r.verdict, "not linearizable");
        assert!(r.detail.is_some());
        // A read that sees an add and a later read that does not.
        let flicker = vec![
            Operation::returned(0, add("lin-a"), 0, 100, SetOutput::Added),
            Operation::returned(1, SetInput::ReadAll, 10, 20, all(&["lin-a"])),
            Operation::returned(1, SetInput::ReadAll, 30, 40, all(&[])),
        ];
        assert_eq!(judge(&flicker, 0).verdict, "not linearizable");
    }
}
