//! A linearizability checker for recorded histories.
//!
//! A chaos client records what it asked a system (the coordinator's small
//! register or set) and what came back, with the wall-clock time of the call
//! and of the return. [`check`] decides whether some total order of those
//! operations, each placed at a single instant between its call and its
//! return, is a legal run of a sequential [`Model`].
//!
//! The search is Wing and Gong's backtracking with Lowe's memoization, the
//! algorithm porcupine and todc-utils use: the history becomes a list of call
//! and return events in time order; the search linearizes any call that
//! precedes the first pending return and whose effect the model accepts,
//! removes it from the list (dancing links, so undo is O(1)), and backtracks
//! when it reaches a return it could not precede. A set of (linearized ops,
//! model state) pairs already explored cuts the exponential blow-up: two
//! orders that linearized the same ops into the same state have the same
//! future. A step bound ([`Limits::max_steps`]) turns a search that would run
//! for hours into [`Verdict::Unknown`].
//!
//! Operations that never returned (the client crashed or gave up) may have
//! taken effect at any instant after their call, or never. A crashed op the
//! model calls read-only ([`Model::is_read_only`]) is dropped: it constrains
//! nothing. Any other crashed op is a call with no return event: the search
//! may linearize it whenever it is reachable, and success only needs every
//! *completed* op linearized, which covers "never".
//!
//! Times are plain `u64`s in any one monotonic unit. A call and a return at
//! the same instant count as concurrent (the call sorts first), which is the
//! lenient reading of a clock too coarse to order them.
//!
//! Cost: a 402-op register history over 8 clients, each op's interval
//! overlapping up to eight others, ending in a read of a value never written
//! (so the search must exhaust every order it can reach), checks in 20-40 ms
//! in a debug build on the 2-core dev VM
//! (`long_history_with_a_stale_read_at_the_end`, run with `--nocapture`;
//! not a timed test).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::{self, Debug, Write as _};
use std::hash::Hash;

use thiserror::Error;

/// A sequential specification the history is checked against.
pub trait Model {
    /// The model's state; hashed and compared by the memo.
    type State: Clone + Eq + Hash + Debug;
    /// What a client asked.
    type Input: Debug;
    /// What came back.
    type Output: Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` takes effect in `state` and answers `output`,
    /// or `None` if the model could not have answered `output` there.
    fn step(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> Option<Self::State>;

    /// The state after `input` takes effect when its answer was never seen
    /// (the client crashed), or `None` if it cannot take effect in `state`.
    fn step_unanswered(&self, state: &Self::State, input: &Self::Input) -> Option<Self::State>;

    /// Whether `input` leaves every state unchanged: such an op that never
    /// returned constrains nothing and is dropped before the search.
    fn is_read_only(&self, input: &Self::Input) -> bool;
}

/// Which client issued an operation; used only in explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u64);

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<O> {
    /// The client saw `output` at `time`.
    Returned {
        /// When the answer arrived, in the history's time unit.
        time: u64,
        /// The answer.
        output: O,
    },
    /// The client never saw an answer: the op took effect at some instant
    /// after its call, or never.
    Crashed,
}

/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Who issued it.
    pub client: ClientId,
    /// What was asked.
    pub input: I,
    /// When it was called, in the history's time unit.
    pub call_time: u64,
    /// How it ended.
    pub outcome: Outcome<O>,
}

impl<I, O> Operation<I, O> {
    /// An op that returned `output` at `return_time`.
    pub fn returned(client: u64, input: I, call_time: u64, return_time: u64, output: O) -> Self {
        Self { client: ClientId(client), input, call_time, outcome: Outcome::Returned { time: return_time, output } }
    }

    /// An op whose client never saw an answer.
    pub fn crashed(client: u64, input: I, call_time: u64) -> Self {
        Self { client: ClientId(client), input, call_time, outcome: Outcome::Crashed }
    }
}

/// A history the checker refuses to read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HistoryError {
    /// An op returned before it was called: the recorder's clock or
    /// bookkeeping is wrong, and no verdict would mean anything.
    #[error("operation #{index} (client {client}) returns at {return_time}, before its call at {call_time}")]
    ReturnBeforeCall {
        /// Index of the op in the history.
        index: usize,
        /// Its client.
        client: u64,
        /// Its call time.
        call_time: u64,
        /// Its return time.
        return_time: u64,
    },
}

/// How far the search may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Search steps (one per event visited) before giving up with
    /// [`Verdict::Unknown`]. Default 10,000,000: well under a minute in a
    /// debug build for register histories.
    pub max_steps: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_steps: 10_000_000 }
    }
}

/// Why a history is not linearizable: the furthest the search got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counterexample {
    /// Indices (into the checked history) of the longest linearizable
    /// prefix found, in linearization order.
    pub prefix: Vec<usize>,
    /// Index of the completed op that could not be placed after that prefix
    /// (nor could any op concurrent with it).
    pub blocked: usize,
    /// The two above in words, with the model state after the prefix.
    pub explanation: String,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explanation)
    }
}

/// The checker's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the ops is a legal sequential run.
    Linearizable,
    /// No order is.
    NotLinearizable(Counterexample),
    /// The search hit [`Limits::max_steps`] before deciding.
    Unknown {
        /// Steps taken.
        steps: u64,
    },
}

impl Verdict {
    /// Whether the verdict is [`Verdict::Linearizable`].
    pub fn is_linearizable(&self) -> bool {
        matches!(self, Verdict::Linearizable)
    }
}

/// Checks `history` against `model` with the default [`Limits`].
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>]) -> Result<Verdict, HistoryError> {
    check_with(model, history, Limits::default())
}

/// Checks `history` against `model`, giving up after `limits.max_steps`.
pub fn check_with<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    limits: Limits,
) -> Result<Verdict, HistoryError> {
    validate(history)?;
    Ok(Search::new(model, history, None).run(limits.max_steps))
}

/// An op on the object at key `K`, each object modelled by `M`.
pub type KeyedOperation<K, M> = Operation<(K, <M as Model>::Input), <M as Model>::Output>;

/// Checks a history of ops on keyed objects (`(key, input)`), each key
/// against its own copy of `model`. Ops on different keys commute, so each
/// key's part can be checked alone (P-compositionality), which is much
/// cheaper than one search over all of them. Keys are checked in order; the
/// first non-linearizable key decides the verdict (its counterexample's
/// indices refer to `history`, and its explanation names the key), else any
/// key that hit the step bound makes it [`Verdict::Unknown`] (steps summed),
/// else the history is linearizable. The step bound applies to each key.
pub fn check_by_key<M, K>(model: &M, history: &[KeyedOperation<K, M>], limits: Limits) -> Result<Verdict, HistoryError>
where
    M: Model,
    M::Input: Clone,
    M::Output: Clone,
    K: Ord + Clone + Debug,
{
    validate(history)?;
    let mut unknown_steps = None;
    for (key, indices) in partition_by_key(history, |(k, _)| k.clone()) {
        let part: Vec<Operation<M::Input, M::Output>> = indices
            .iter()
            .map(|&i| {
                let op = &history[i];
                Operation {
                    client: op.client,
                    input: op.input.1.clone(),
                    call_time: op.call_time,
                    outcome: op.outcome.clone(),
                }
            })
            .collect();
        match Search::new(model, &part, Some(&indices)).run(limits.max_steps) {
            Verdict::Linearizable => {}
            Verdict::Unknown { steps } => *unknown_steps.get_or_insert(0) += steps,
            Verdict::NotLinearizable(c) => {
                return Ok(Verdict::NotLinearizable(Counterexample {
                    explanation: format!("key {key:?}: {}", c.explanation),
                    ..c
                }));
            }
        }
    }
    Ok(match unknown_steps {
        Some(steps) => Verdict::Unknown { steps },
        None => Verdict::Linearizable,
    })
}

/// Groups the indices of `history`'s ops by `key`, keys in order, each
/// group in history order.
pub fn partition_by_key<I, O, K: Ord, F: Fn(&I) -> K>(history: &[Operation<I, O>], key: F) -> BTreeMap<K, Vec<usize>> {
    let mut parts: BTreeMap<K, Vec<usize>> = BTreeMap::new();
    for (i, op) in history.iter().enumerate() {
        parts.entry(key(&op.input)).or_default().push(i);
    }
    parts
}

fn validate<I, O>(history: &[Operation<I, O>]) -> Result<(), HistoryError> {
    for (index, op) in history.iter().enumerate() {
        if let Outcome::Returned { time, .. } = op.outcome
            && time < op.call_time
        {
            return Err(HistoryError::ReturnBeforeCall {
                index,
                client: op.client.0,
                call_time: op.call_time,
                return_time: time,
            });
        }
    }
    Ok(())
}

/// Sentinel index of the list head.
const HEAD: usize = 0;
/// "No neighbour" in the event list.
const NIL: usize = usize::MAX;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Call,
    Return,
}

/// One node of the doubly linked event list. Node 0 is the head sentinel.
#[derive(Clone, Copy, Debug)]
struct Event {
    kind: Kind,
    /// Index of the op in the checked history.
    op: usize,
    prev: usize,
    next: usize,
}

/// A fixed-size bit set of linearized ops, the memo key's first half.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Box<[u64]>);

impl Bits {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)].into_boxed_slice())
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

struct Search<'a, M: Model> {
    model: &'a M,
    history: &'a [Operation<M::Input, M::Output>],
    events: Vec<Event>,
    /// Per op: its call node and its return node (`NIL` for a crashed op).
    call_node: Vec<usize>,
    return_node: Vec<usize>,
    /// Completed ops not yet linearized; zero means success.
    pending_returns: usize,
    /// How ops are numbered in the verdict: their index in the caller's
    /// history, which differs from ours when checking one key's part.
    ids: Option<&'a [usize]>,
}

impl<'a, M: Model> Search<'a, M> {
    fn new(model: &'a M, history: &'a [Operation<M::Input, M::Output>], ids: Option<&'a [usize]>) -> Self {
        // (time, kind rank, op): calls sort before returns at the same time,
        // so touching intervals count as concurrent; op index breaks ties so
        // the order (and therefore the explanation) is deterministic.
        let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(history.len() * 2);
        for (i, op) in history.iter().enumerate() {
            match op.outcome {
                Outcome::Crashed if model.is_read_only(&op.input) => {}
                Outcome::Crashed => order.push((op.call_time, 0, i)),
                Outcome::Returned { time, .. } => {
                    order.push((op.call_time, 0, i));
                    order.push((time, 1, i));
                }
            }
        }
        order.sort_unstable();
        let mut events = Vec::with_capacity(order.len() + 1);
        events.push(Event { kind: Kind::Call, op: NIL, prev: NIL, next: if order.is_empty() { NIL } else { 1 } });
        let mut call_node = vec![NIL; history.len()];
        let mut return_node = vec![NIL; history.len()];
        let n = order.len();
        for (pos, &(_, rank, op)) in order.iter().enumerate() {
            let node = pos + 1;
            let kind = if rank == 0 { Kind::Call } else { Kind::Return };
            match kind {
                Kind::Call => call_node[op] = node,
                Kind::Return => return_node[op] = node,
            }
            events.push(Event { kind, op, prev: node - 1, next: if node == n { NIL } else { node + 1 } });
        }
        let pending_returns = return_node.iter().filter(|&&r| r != NIL).count();
        Self { model, history, events, call_node, return_node, pending_returns, ids }
    }

    /// Removes `op`'s call and (if any) return from the list.
    fn lift(&mut self, op: usize) {
        for node in [self.call_node[op], self.return_node[op]] {
            if node == NIL {
                continue;
            }
            let Event { prev, next, .. } = self.events[node];
            self.events[prev].next = next;
            if next != NIL {
                self.events[next].prev = prev;
            }
        }
        if self.return_node[op] != NIL {
            self.pending_returns -= 1;
        }
    }

    /// Undoes the matching [`Search::lift`]; lifts are undone last-first, so
    /// each node's saved neighbours are current again.
    fn unlift(&mut self, op: usize) {
        for node in [self.return_node[op], self.call_node[op]] {
            if node == NIL {
                continue;
            }
            let Event { prev, next, .. } = self.events[node];
            self.events[prev].next = node;
            if next != NIL {
                self.events[next].prev = node;
            }
        }
        if self.return_node[op] != NIL {
            self.pending_returns += 1;
        }
    }

    fn apply(&self, state: &M::State, op: usize) -> Option<M::State> {
        let o = &self.history[op];
        match &o.outcome {
            Outcome::Returned { output, .. } => self.model.step(state, &o.input, output),
            Outcome::Crashed => self.model.step_unanswered(state, &o.input),
        }
    }

    fn run(mut self, max_steps: u64) -> Verdict {
        let mut state = self.model.init();
        let mut linearized = Bits::new(self.history.len());
        // Membership only: iteration order never reaches a result.
        let mut seen: HashSet<(Bits, M::State)> = HashSet::new();
        // (op, state before it), in linearization order.
        let mut stack: Vec<(usize, M::State)> = Vec::new();
        // The deepest dead end: (prefix, blocked op, state after prefix).
        let mut deepest: Option<(Vec<usize>, usize, M::State)> = None;
        let mut node = self.events[HEAD].next;
        let mut steps = 0u64;
        while self.pending_returns > 0 {
            steps += 1;
            if steps > max_steps {
                return Verdict::Unknown { steps: max_steps };
            }
            // Invariant: a return event is still listed (pending_returns > 0)
            // and `node` only advances over calls, so it stops on a return
            // before the list ends.
            debug_assert_ne!(node, NIL);
            let ev = self.events[node];
            match ev.kind {
                Kind::Call => {
                    let next_state = self.apply(&state, ev.op);
                    let fresh = next_state.and_then(|s| {
                        let mut bits = linearized.clone();
                        bits.set(ev.op);
                        seen.insert((bits, s.clone())).then_some(s)
                    });
                    match fresh {
                        Some(s) => {
                            stack.push((ev.op, std::mem::replace(&mut state, s)));
                            linearized.set(ev.op);
                            self.lift(ev.op);
                            node = self.events[HEAD].next;
                        }
                        None => node = ev.next,
                    }
                }
                Kind::Return => {
                    if deepest.as_ref().is_none_or(|(p, _, _)| stack.len() > p.len()) {
                        deepest = Some((stack.iter().map(|&(op, _)| op).collect(), ev.op, state.clone()));
                    }
                    let Some((op, before)) = stack.pop() else {
                        let (prefix, blocked, after) = deepest.unwrap_or((Vec::new(), ev.op, state));
                        return Verdict::NotLinearizable(self.explain(prefix, blocked, &after));
                    };
                    state = before;
                    linearized.clear(op);
                    self.unlift(op);
                    node = self.events[self.call_node[op]].next;
                }
            }
        }
        Verdict::Linearizable
    }

    fn explain(&self, prefix: Vec<usize>, blocked: usize, after: &M::State) -> Counterexample {
        const SHOWN: usize = 8;
        let completed = self.return_node.iter().filter(|&&r| r != NIL).count();
        let mut text =
            format!("longest linearizable prefix: {} ops ({} completed ops in all)", prefix.len(), completed);
        if prefix.len() > SHOWN {
            let _ = write!(text, ", the last {SHOWN}:");
        } else if !prefix.is_empty() {
            text.push(':');
        }
        for &op in &prefix[prefix.len().saturating_sub(SHOWN)..] {
            let _ = write!(text, " {};", self.describe(op));
        }
        let _ = write!(text, " state after it: {after:?}; cannot place {}", self.describe(blocked));
        let rivals: Vec<String> = (0..self.history.len())
            .filter(|&op| op != blocked && !prefix.contains(&op) && self.call_node[op] != NIL)
            .filter(|&op| self.history[op].call_time <= self.return_time(blocked))
            .map(|op| format!("#{}", self.id(op)))
            .collect();
        if rivals.is_empty() {
            text.push_str(" (no other op could go first)");
        } else {
            let _ = write!(text, " nor any of the unplaced ops called before it returned ({})", rivals.join(", "));
        }
        Counterexample {
            prefix: prefix.iter().map(|&op| self.id(op)).collect(),
            blocked: self.id(blocked),
            explanation: text,
        }
    }

    fn id(&self, op: usize) -> usize {
        self.ids.map_or(op, |ids| ids[op])
    }

    fn return_time(&self, op: usize) -> u64 {
        match self.history[op].outcome {
            Outcome::Returned { time, .. } => time,
            Outcome::Crashed => u64::MAX,
        }
    }

    fn describe(&self, op: usize) -> String {
        let o = &self.history[op];
        match &o.outcome {
            Outcome::Returned { time, output } => {
                format!(
                    "#{} client {} {:?} -> {:?} [{}, {}]",
                    self.id(op),
                    o.client.0,
                    o.input,
                    output,
                    o.call_time,
                    time
                )
            }
            Outcome::Crashed => {
                format!("#{} client {} {:?} -> crashed [{}, ..)", self.id(op), o.client.0, o.input, o.call_time)
            }
        }
    }
}

/// The [`Model`] of a single read/write register of `V`s, holding `None`
/// until the first write.
#[derive(Debug)]
pub struct Register<V>(std::marker::PhantomData<fn() -> V>);

impl<V> Default for Register<V> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// An operation on a [`Register`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterInput<V> {
    /// Store a value.
    Write(V),
    /// Read the value.
    Read,
}

/// A [`Register`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterOutput<V> {
    /// A write was applied.
    Written,
    /// A read saw this value (`None`: never written).
    Value(Option<V>),
}

impl<V: Clone + Eq + Hash + Debug> Model for Register<V> {
    type State = Option<V>;
    type Input = RegisterInput<V>;
    type Output = RegisterOutput<V>;

    fn init(&self) -> Option<V> {
        None
    }

    fn step(&self, state: &Option<V>, input: &RegisterInput<V>, output: &RegisterOutput<V>) -> Option<Option<V>> {
        match (input, output) {
            (RegisterInput::Write(v), RegisterOutput::Written) => Some(Some(v.clone())),
            (RegisterInput::Read, RegisterOutput::Value(seen)) => (seen == state).then(|| state.clone()),
            _ => None,
        }
    }

    fn step_unanswered(&self, state: &Option<V>, input: &RegisterInput<V>) -> Option<Option<V>> {
        match input {
            RegisterInput::Write(v) => Some(Some(v.clone())),
            RegisterInput::Read => Some(state.clone()),
        }
    }

    fn is_read_only(&self, input: &RegisterInput<V>) -> bool {
        matches!(input, RegisterInput::Read)
    }
}

/// The [`Model`] of a grow-only set of `T`s, empty at first.
#[derive(Debug)]
pub struct GrowSet<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Default for GrowSet<T> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// An operation on a [`GrowSet`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetInput<T> {
    /// Add one element.
    Add(T),
    /// Read every element.
    ReadAll,
}

/// A [`GrowSet`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetOutput<T> {
    /// An add was applied.
    Added,
    /// A read saw exactly these elements.
    All(BTreeSet<T>),
}

impl<T: Clone + Ord + Hash + Debug> Model for GrowSet<T> {
    type State = BTreeSet<T>;
    type Input = SetInput<T>;
    type Output = SetOutput<T>;

    fn init(&self) -> BTreeSet<T> {
        BTreeSet::new()
    }

    fn step(&self, state: &BTreeSet<T>, input: &SetInput<T>, output: &SetOutput<T>) -> Option<BTreeSet<T>> {
        match (input, output) {
            (SetInput::Add(x), SetOutput::Added) => Some(added(state, x)),
            (SetInput::ReadAll, SetOutput::All(seen)) => (seen == state).then(|| state.clone()),
            _ => None,
        }
    }

    fn step_unanswered(&self, state: &BTreeSet<T>, input: &SetInput<T>) -> Option<BTreeSet<T>> {
        match input {
            SetInput::Add(x) => Some(added(state, x)),
            SetInput::ReadAll => Some(state.clone()),
        }
    }

    fn is_read_only(&self, input: &SetInput<T>) -> bool {
        matches!(input, SetInput::ReadAll)
    }
}

fn added<T: Clone + Ord>(state: &BTreeSet<T>, x: &T) -> BTreeSet<T> {
    let mut next = state.clone();
    next.insert(x.clone());
    next
}

#[cfg(test)]
mod tests;
