use proptest::prelude::*;

use super::*;

type Op = Operation<RegisterInput<u32>, RegisterOutput<u32>>;

fn w(client: u64, v: u32, call: u64, ret: u64) -> Op {
    Operation::returned(client, RegisterInput::Write(v), call, ret, RegisterOutput::Written)
}

fn r(client: u64, seen: Option<u32>, call: u64, ret: u64) -> Op {
    Operation::returned(client, RegisterInput::Read, call, ret, RegisterOutput::Value(seen))
}

fn w_crashed(client: u64, v: u32, call: u64) -> Op {
    Operation::crashed(client, RegisterInput::Write(v), call)
}

fn verdict(history: &[Op]) -> Verdict {
    check(&Register::<u32>::default(), history).expect("valid history")
}

fn counterexample(history: &[Op]) -> Counterexample {
    match verdict(history) {
        Verdict::NotLinearizable(c) => c,
        other => panic!("expected not linearizable, got {other:?}"),
    }
}

#[test]
fn empty_history_is_linearizable() {
    assert_eq!(verdict(&[]), Verdict::Linearizable);
}

#[test]
fn sequential_writes_and_reads_are_linearizable() {
    let h = [r(0, None, 0, 1), w(0, 1, 2, 3), r(1, Some(1), 4, 5), w(1, 2, 6, 7), r(0, Some(2), 8, 9)];
    assert_eq!(verdict(&h), Verdict::Linearizable);
}

#[test]
fn stale_read_is_not_linearizable_and_names_the_read() {
    let h = [w(0, 1, 0, 1), w(0, 2, 2, 3), r(1, Some(1), 4, 5)];
    let c = counterexample(&h);
    assert_eq!(c.prefix, vec![0, 1]);
    assert_eq!(c.blocked, 2);
    assert!(c.explanation.contains("cannot place #2 client 1 Read -> Value(Some(1))"), "{}", c.explanation);
    assert!(c.explanation.contains("state after it: Some(2)"), "{}", c.explanation);
}

#[test]
fn lost_write_is_not_linearizable() {
    // The write was acknowledged, then a later read sees the register as
    // never written.
    let h = [w(0, 1, 0, 1), r(1, None, 2, 3)];
    let c = counterexample(&h);
    assert_eq!(c.blocked, 1);
}

#[test]
fn read_of_a_never_written_value_is_not_linearizable() {
    let h = [w(0, 1, 0, 10), r(1, Some(7), 2, 3)];
    let c = counterexample(&h);
    assert_eq!(c.blocked, 1);
    assert!(c.prefix.is_empty() || c.prefix == vec![0], "{c:?}");
}

#[test]
fn reads_overlapping_a_write_may_see_either_value() {
    let h = [w(0, 1, 0, 10), r(1, None, 1, 3), r(1, Some(1), 4, 6), r(2, Some(1), 7, 9), r(2, Some(1), 11, 12)];
    assert_eq!(verdict(&h), Verdict::Linearizable);
}

#[test]
fn a_read_cannot_go_back_to_the_old_value() {
    // Both reads overlap the write, but once one has seen 1 a later one
    // cannot see the old value.
    let h = [w(0, 1, 0, 10), r(1, Some(1), 1, 3), r(1, None, 4, 6)];
    assert_eq!(counterexample(&h).blocked, 2);
}

#[test]
fn concurrent_writes_may_land_in_either_order() {
    for last in [1, 2] {
        let h = [w(0, 1, 0, 10), w(1, 2, 0, 10), r(2, Some(last), 11, 12)];
        assert_eq!(verdict(&h), Verdict::Linearizable, "last {last}");
    }
    // But two later reads must agree on which came last.
    let h = [w(0, 1, 0, 10), w(1, 2, 0, 10), r(2, Some(1), 11, 12), r(2, Some(2), 13, 14)];
    assert!(!verdict(&h).is_linearizable());
}

#[test]
fn touching_intervals_count_as_concurrent() {
    // The read returns at the instant the write is called: the coarse clock
    // cannot order them, so the read may see the write.
    let h = [r(0, Some(1), 0, 5), w(1, 1, 5, 6)];
    assert_eq!(verdict(&h), Verdict::Linearizable);
}

#[test]
fn crashed_write_may_take_effect_later_or_never() {
    assert_eq!(verdict(&[w_crashed(0, 1, 0), r(1, Some(1), 5, 6)]), Verdict::Linearizable);
    assert_eq!(verdict(&[w_crashed(0, 1, 0), r(1, None, 5, 6)]), Verdict::Linearizable);
    // Not seen, then seen, long after the crash: it took effect in between.
    assert_eq!(verdict(&[w_crashed(0, 1, 0), r(1, None, 5, 6), r(1, Some(1), 7, 8)]), Verdict::Linearizable);
    // Seen, then not seen: a write takes effect once.
    assert!(!verdict(&[w_crashed(0, 1, 0), r(1, Some(1), 5, 6), r(1, None, 7, 8)]).is_linearizable());
}

#[test]
fn crashed_write_cannot_take_effect_before_its_call() {
    let h = [r(0, Some(1), 0, 1), w_crashed(1, 1, 2)];
    assert_eq!(counterexample(&h).blocked, 0);
}

#[test]
fn crashed_write_may_be_overwritten_by_a_later_one() {
    let h = [w_crashed(0, 1, 0), w(1, 2, 5, 6), r(1, Some(2), 7, 8), r(1, Some(1), 9, 10)];
    // 1 can only land before 2 or not at all... or after the first read: it
    // never returned, so it may take effect at 8.5.
    assert_eq!(verdict(&h), Verdict::Linearizable);
    let h = [w_crashed(0, 1, 0), w(1, 2, 5, 6), r(1, Some(1), 7, 8), r(1, Some(2), 9, 10)];
    assert!(!verdict(&h).is_linearizable());
}

#[test]
fn crashed_reads_are_dropped() {
    let crashed_read = Operation::crashed(3, RegisterInput::Read, 0);
    assert_eq!(verdict(std::slice::from_ref(&crashed_read)), Verdict::Linearizable);
    assert_eq!(verdict(&[crashed_read, w(0, 1, 1, 2), r(0, Some(1), 3, 4)]), Verdict::Linearizable);
}

#[test]
fn a_return_before_its_call_is_refused() {
    let err = check(&Register::<u32>::default(), &[w(4, 1, 10, 9)]).unwrap_err();
    assert_eq!(err, HistoryError::ReturnBeforeCall { index: 0, client: 4, call_time: 10, return_time: 9 });
    assert!(err.to_string().contains("operation #0 (client 4)"));
}

#[test]
fn step_bound_gives_unknown() {
    let h = [w(0, 1, 0, 10), w(1, 2, 0, 10), r(2, Some(3), 11, 12)];
    assert_eq!(check_with(&Register::<u32>::default(), &h, Limits { max_steps: 3 }), Ok(Verdict::Unknown { steps: 3 }));
    assert!(matches!(verdict(&h), Verdict::NotLinearizable(_)));
}

#[test]
fn mismatched_output_kind_is_not_linearizable() {
    let h = [Operation::returned(0, RegisterInput::Read, 0, 1, RegisterOutput::Written)];
    assert!(!verdict(&h).is_linearizable());
}

fn add(client: u64, x: u32, call: u64, ret: u64) -> Operation<SetInput<u32>, SetOutput<u32>> {
    Operation::returned(client, SetInput::Add(x), call, ret, SetOutput::Added)
}

fn read_all(client: u64, xs: &[u32], call: u64, ret: u64) -> Operation<SetInput<u32>, SetOutput<u32>> {
    Operation::returned(client, SetInput::ReadAll, call, ret, SetOutput::All(xs.iter().copied().collect()))
}

#[test]
fn grow_set_concurrent_adds_and_reads() {
    let model = GrowSet::<u32>::default();
    let ok = [add(0, 1, 0, 10), add(1, 2, 0, 10), read_all(2, &[2], 1, 3), read_all(2, &[1, 2], 11, 12)];
    assert_eq!(check(&model, &ok), Ok(Verdict::Linearizable));
    // Two reads concurrent with both adds: one saw only 1, the other only 2.
    // Either alone is fine; together they need each add before the other.
    let split = [add(0, 1, 0, 10), add(1, 2, 0, 10), read_all(2, &[1], 1, 3), read_all(3, &[2], 1, 3)];
    assert!(!check(&model, &split).unwrap().is_linearizable());
}

#[test]
fn grow_set_lost_add_is_not_linearizable() {
    let model = GrowSet::<u32>::default();
    let h = [add(0, 1, 0, 1), add(1, 2, 2, 3), read_all(2, &[2], 4, 5)];
    let Ok(Verdict::NotLinearizable(c)) = check(&model, &h) else { panic!("lost add passed") };
    assert_eq!((c.prefix, c.blocked), (vec![0, 1], 2));
    // A crashed add may or may not be in a later read.
    let crashed = Operation::crashed(0, SetInput::Add(9), 0);
    for seen in [&[][..], &[9][..]] {
        assert_eq!(check(&model, &[crashed.clone(), read_all(1, seen, 5, 6)]), Ok(Verdict::Linearizable));
    }
}

#[test]
fn check_by_key_checks_each_key_alone_and_maps_indices_back() {
    let model = Register::<u32>::default();
    let keyed = |k: &'static str, op: Op| Operation {
        client: op.client,
        input: (k, op.input),
        call_time: op.call_time,
        outcome: op.outcome,
    };
    let h = vec![
        keyed("a", w(0, 1, 0, 1)),
        keyed("b", w(1, 5, 0, 1)),
        keyed("a", r(0, Some(1), 2, 3)),
        keyed("b", r(1, Some(5), 2, 3)),
    ];
    assert_eq!(check_by_key(&model, &h, Limits::default()), Ok(Verdict::Linearizable));
    // Read 5 under key "a": fine for one register, wrong per key.
    let mut bad = h.clone();
    bad.push(keyed("a", r(2, Some(5), 4, 5)));
    let Ok(Verdict::NotLinearizable(c)) = check_by_key(&model, &bad, Limits::default()) else {
        panic!("a cross-key read passed")
    };
    assert_eq!((c.prefix, c.blocked), (vec![0, 2], 4));
    assert!(c.explanation.starts_with("key \"a\": "), "{}", c.explanation);
    assert!(c.explanation.contains("cannot place #4 "), "{}", c.explanation);
    let parts = partition_by_key(&bad, |(k, _)| *k);
    assert_eq!(parts.into_iter().collect::<Vec<_>>(), vec![("a", vec![0, 2, 4]), ("b", vec![1, 3])]);
}

/// A history of `ops` register operations from a sequential run: op `i`
/// takes effect at `100 * i`, is called up to `spread` before and returns up
/// to `spread` after (so with a large spread many ops overlap), and reads
/// answer the value at that instant. `crash` marks writes whose client
/// crashed; `effect` says whether that crashed write still took effect.
fn sequential_history(ops: &[(bool, u32, u64, u64, bool, bool)], spread: u64) -> Vec<Op> {
    let mut value = None;
    ops.iter()
        .enumerate()
        .map(|(i, &(is_write, v, before, after, crash, effect))| {
            let t = 100 * i as u64 + spread;
            let (call, ret) = (t - before % (spread + 1), t + after % (spread + 1));
            let client = i as u64 % 8;
            if is_write {
                if crash {
                    if effect {
                        value = Some(v);
                    }
                    w_crashed(client, v, call)
                } else {
                    value = Some(v);
                    w(client, v, call, ret)
                }
            } else {
                r(client, value, call, ret)
            }
        })
        .collect()
}

fn op_strategy() -> impl Strategy<Value = (bool, u32, u64, u64, bool, bool)> {
    (any::<bool>(), 0u32..4, any::<u64>(), any::<u64>(), prop::bool::weighted(0.1), any::<bool>())
}

/// Linearizability by brute force: some subset of the crashed ops and some
/// order of everything kept respects real time and the model. Exponential;
/// for histories of a handful of ops.
fn brute_force(history: &[Op]) -> bool {
    let model = Register::<u32>::default();
    let crashed: Vec<usize> = (0..history.len()).filter(|&i| history[i].outcome == Outcome::Crashed).collect();
    let ends = |i: usize| match history[i].outcome {
        Outcome::Returned { time, .. } => time,
        Outcome::Crashed => u64::MAX,
    };
    fn orders(left: &mut Vec<usize>, done: &mut Vec<usize>, ok: &mut dyn FnMut(&[usize]) -> bool) -> bool {
        if left.is_empty() {
            return ok(done);
        }
        for k in 0..left.len() {
            let op = left.remove(k);
            done.push(op);
            let found = orders(left, done, ok);
            done.pop();
            left.insert(k, op);
            if found {
                return true;
            }
        }
        false
    }
    (0..1u32 << crashed.len()).any(|mask| {
        let mut keep: Vec<usize> = (0..history.len())
            .filter(|i| crashed.iter().position(|c| c == i).is_none_or(|bit| mask & (1 << bit) != 0))
            .collect();
        orders(&mut keep, &mut Vec::new(), &mut |order| {
            // No op placed after `a` returned before `a` was called.
            let respects_time = order
                .iter()
                .enumerate()
                .all(|(pos, &a)| order[pos + 1..].iter().all(|&b| ends(b) >= history[a].call_time));
            let mut state = model.init();
            respects_time
                && order.iter().all(|&i| {
                    let op = &history[i];
                    let next = match &op.outcome {
                        Outcome::Returned { output, .. } => model.step(&state, &op.input, output),
                        Outcome::Crashed => model.step_unanswered(&state, &op.input),
                    };
                    next.map(|n| state = n).is_some()
                })
        })
    })
}

fn small_op() -> impl Strategy<Value = Op> {
    (any::<bool>(), 0u32..3, 0u64..3, 0u64..10, 0u64..10, prop::bool::weighted(0.15)).prop_map(
        |(is_write, v, client, call, len, crash)| match (is_write, crash) {
            (true, true) => w_crashed(client, v, call),
            (true, false) => w(client, v, call, call + len),
            (false, _) => r(client, (v > 0).then_some(v), call, call + len),
        },
    )
}

proptest! {
    /// The memoizing search agrees with brute force on small random
    /// histories, linearizable or not (so it is neither too strict nor too
    /// lenient, crashed writes included).
    #[test]
    fn agrees_with_brute_force(h in prop::collection::vec(small_op(), 0..7)) {
        // 20,000 cases once: 52% linearizable, 48% not, all agreeing.
        prop_assert_eq!(verdict(&h).is_linearizable(), brute_force(&h), "{:?}", h);
    }

    #[test]
    fn sequential_runs_with_overlapping_intervals_are_linearizable(
        ops in prop::collection::vec(op_strategy(), 0..60),
        spread in 0u64..400,
    ) {
        let h = sequential_history(&ops, spread);
        prop_assert_eq!(verdict(&h), Verdict::Linearizable);
    }

    #[test]
    fn one_corrupt_read_in_a_sequential_history_is_caught(
        ops in prop::collection::vec(op_strategy(), 1..60),
        pick in any::<prop::sample::Index>(),
        wrong in 0u32..4,
    ) {
        // No crashes: a crashed write could explain any read.
        let ops: Vec<_> = ops.into_iter().map(|(wr, v, b, a, _, _)| (wr, v, b, a, false, false)).collect();
        let mut h = sequential_history(&ops, 0);
        let reads: Vec<usize> = (0..h.len()).filter(|&i| h[i].input == RegisterInput::Read).collect();
        prop_assume!(!reads.is_empty());
        let at = reads[pick.index(reads.len())];
        let Outcome::Returned { output: RegisterOutput::Value(seen), .. } = &mut h[at].outcome else { unreachable!() };
        let corrupt = if *seen == Some(wrong) { Some(wrong + 1) } else { Some(wrong) };
        *seen = corrupt;
        let Verdict::NotLinearizable(c) = verdict(&h) else { panic!("corrupt read #{at} passed") };
        prop_assert_eq!(c.blocked, at);
        prop_assert_eq!(c.prefix, (0..at).collect::<Vec<_>>());
    }
}

/// 400 ops from 8 clients, each interval overlapping up to eight others, and
/// a stale read at the end, so the search must exhaust every order it can
/// reach. Measured on the 2-core dev VM: see the module docs.
#[test]
fn long_history_with_a_stale_read_at_the_end() {
    let ops: Vec<_> = (0..400u64)
        .map(|i| {
            let x = granary_proto::rng::seed_of(&[i]);
            (x.is_multiple_of(2), (x >> 8) as u32 % 16, x >> 16, x >> 32, false, false)
        })
        .collect();
    let mut h = sequential_history(&ops, 400);
    let end = h.iter().map(|op| match op.outcome {
        Outcome::Returned { time, .. } => time,
        Outcome::Crashed => op.call_time,
    });
    let end = end.max().unwrap_or(0);
    h.push(w(0, 100, end + 1, end + 2));
    h.push(r(1, Some(99), end + 3, end + 4));
    let started = std::time::Instant::now();
    let v = verdict(&h);
    eprintln!("400-op history checked in {:?}", started.elapsed());
    let Verdict::NotLinearizable(c) = v else { panic!("stale read passed: {v:?}") };
    assert_eq!(c.blocked, 401);
    assert_eq!(c.prefix.len(), 401);
}
