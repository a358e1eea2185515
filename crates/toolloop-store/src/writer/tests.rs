use super::*;

fn item(run: &str, n: usize) -> Item {
    let (done, _) = oneshot::channel();
    (
        Append {
            run_id: run.into(),
            holder: None,
            kind: "finished".into(),
            body: "{}".into(),
            count: n,
            start: None,
            finished: false,
            take_lease: None,
            release: false,
        },
        done,
    )
}

fn none() -> Runs {
    Runs::default()
}

fn runs_of(ids: &[&str]) -> Runs {
    ids.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_batch_takes_one_append_per_run_in_order_within_the_limits() {
    let mut waiting: VecDeque<Item> = [
        item("a", 1),
        item("b", 2),
        item("a", 3),
        item("c", 1),
        item("a", 1),
    ]
    .into_iter()
    .collect();
    let runs = |b: &[Item]| b.iter().map(|(a, _)| a.run_id.clone()).collect::<Vec<_>>();
    let first = take_batch(&mut waiting, &none());
    assert_eq!(runs(&first), ["a", "b", "c"]);
    // a's later appends wait, in order.
    assert_eq!(
        waiting.iter().map(|(a, _)| a.count).collect::<Vec<_>>(),
        [3, 1]
    );
    assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
    assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
    assert!(waiting.is_empty());

    // The record limit ends a batch (one oversized append still goes alone).
    let mut waiting: VecDeque<Item> = [item("a", MAX_RECORDS + 5), item("b", 1)]
        .into_iter()
        .collect();
    assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
    assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
    let mut waiting: VecDeque<Item> = (0..MAX_RUNS + 3)
        .map(|i| item(&format!("r{i}"), 1))
        .collect();
    assert_eq!(take_batch(&mut waiting, &none()).len(), MAX_RUNS);
    assert_eq!(take_batch(&mut waiting, &none()).len(), 3);
    // And so does the byte limit.
    let big = |run: &str| {
        let mut it = item(run, 1);
        it.0.body = "x".repeat(MAX_BYTES / 2 + 1);
        it
    };
    let mut waiting: VecDeque<Item> = [big("a"), big("b"), item("c", 1)].into_iter().collect();
    assert_eq!(take_batch(&mut waiting, &none()).len(), 1);
    assert_eq!(take_batch(&mut waiting, &none()).len(), 2);
}

#[test]
fn a_run_of_the_batch_just_answered_waits_for_the_one_after_unless_it_is_alone() {
    let runs = |b: &[Item]| b.iter().map(|(a, _)| a.run_id.clone()).collect::<Vec<_>>();
    let answered = runs_of(&["a"]);
    let mut waiting: VecDeque<Item> = [item("a", 1), item("b", 1), item("c", 1)]
        .into_iter()
        .collect();
    let batch = take_batch(&mut waiting, &answered);
    assert_eq!(runs(&batch), ["b", "c"]);
    // The batch after that one is a's.
    let answered = answer(batch, Ok(Runs::default()));
    assert_eq!(answered, runs_of(&["b", "c"]));
    assert_eq!(runs(&take_batch(&mut waiting, &answered)), ["a"]);
    // A run that writes alone is not kept waiting.
    let mut waiting: VecDeque<Item> = [item("a", 1)].into_iter().collect();
    let answered = runs_of(&["a"]);
    assert_eq!(runs(&take_batch(&mut waiting, &answered)), ["a"]);
}

#[test]
fn the_writer_waits_before_a_commit_only_while_many_runs_share_them() {
    let shared = Arc::new(Shared::new(Duration::from_millis(1)));
    let delay = &shared.delay;
    let mut pace = Pace::new(shared.clone());
    let items: Vec<Item> = (0..30).map(|i| item(&format!("r{i}"), 2)).collect();
    let appends: Vec<&Append> = items.iter().map(|(a, _)| a).collect();
    let ok: Result<(), ()> = Ok(());
    // One run, or two, at a time: never.
    for n in [1, 2, 1, 2, 2, 1, 2, 2, 2, 2, 2, 2] {
        pace.committed(&appends[..n], &ok);
        assert_eq!(pace.wait(1), None, "{}", pace.mean);
    }
    // Many: once the recent commits held four or more on average.
    let mut waited = 0;
    for _ in 0..20 {
        pace.committed(&appends, &ok);
        if pace.wait(1).is_some() {
            waited += 1;
            assert_eq!(pace.wait(1), Some(Duration::from_millis(1)));
            // Not when as many wait as commits have held of late: the writer is behind.
            assert_eq!(pace.wait(30), None);
        }
    }
    assert!(waited >= 15, "{waited}");
    // No delay set: never.
    delay.store(0, Ordering::Relaxed);
    assert_eq!(pace.wait(1), None);
    delay.store(1_000, Ordering::Relaxed);
    // And back to one run at a time: it stops waiting.
    for _ in 0..40 {
        pace.committed(&appends[..1], &ok);
    }
    assert_eq!(pace.wait(1), None, "{}", pace.mean);
    // The counts: 12 commits of 1 or 2 (21 appends), 20 of 30, 40 of 1; and a failure.
    pace.committed(&appends[..3], &Err::<(), ()>(()));
    let stats = Writer::stats_of(&shared);
    assert_eq!(stats.commits, 72);
    assert_eq!(stats.appends, 21 + 600 + 40);
    assert_eq!(stats.records, 2 * stats.appends);
    assert_eq!(stats.failures, 1);
}

#[test]
fn the_writer_knows_a_runs_tail_while_one_holder_writes_it() {
    let append = |run: &str, holder: Option<&str>, count: usize| Append {
        holder: holder.map(str::to_string),
        ..item(run, count).0
    };
    let mut known = Known::default();
    let a = append("a", Some("h1"), 2);
    let at = |last, last_id| Looked {
        fenced: false,
        tail: Tail { last, last_id },
    };
    known.committed(&[&a], &[at(3, Some(7))], &[Some(9)]);
    assert_eq!(
        known.tail(&a),
        Some(Tail {
            last: 5,
            last_id: Some(9)
        })
    );
    // Another holder of the run does not know it.
    assert_eq!(known.tail(&append("a", Some("h2"), 1)), None);
    // Nor does an append that is not fenced (no holder).
    assert_eq!(known.tail(&append("a", None, 1)), None);
    // A release of the lease writes no row: the tail stays, and the run is forgotten.
    let mut release = append("a", Some("h1"), 0);
    release.release = true;
    known.committed(&[&release], &[at(5, Some(9))], &[None]);
    assert_eq!(known.tail(&a), None);
    // Fenced out, or in a failed batch: forgotten.
    known.committed(&[&a], &[at(0, None)], &[Some(1)]);
    assert!(known.tail(&a).is_some());
    let fenced = Looked {
        fenced: true,
        tail: Tail::default(),
    };
    known.committed(&[&a], &[fenced], &[None]);
    assert_eq!(known.tail(&a), None);
    known.committed(&[&a], &[at(0, None)], &[Some(1)]);
    known.forget(&[&a]);
    assert_eq!(known.tail(&a), None);

    // A fence holds, unread, until another connection writes the database.
    known.committed(&[&a], &[at(0, None)], &[Some(1)]);
    assert!(known.fence_holds(&a));
    assert!(!known.fence_holds(&append("a", Some("h2"), 1)));
    known.written_elsewhere();
    assert!(!known.fence_holds(&a), "read again once written elsewhere");
    assert!(known.tail(&a).is_some(), "the tail is still known");
    known.committed(&[&a], &[at(1, Some(1))], &[Some(2)]);
    assert!(known.fence_holds(&a), "read (and held) in this era");
}
