//! PostgreSQL: a batch is one call of the store's function `toolloop_append_batch` (see the
//! migration that makes it) in a transaction, so three round trips whatever its size: the batch
//! goes in as arrays, one element per append, that its statements read with `UNNEST`. It holds
//! the runs' lease rows (`FOR SHARE`) until the commit, so a takeover waits for it. The tails
//! the writer knows go with the batch, so the function looks up only the others.

use super::{Append, Known, Looked, Runs, Tail};

/// The call; its arguments are in the order of the function's.
const APPEND_BATCH: &str = "SELECT o_fenced, o_last, o_ids FROM toolloop_append_batch(\
     $1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
     $7::bigint[], $8::int[], $9::bigint[], $10, $11, $12, $13::int[], $14::text[], \
     $15::text[], $16::bigint[], $17::int[], $18::int[], $19)";

pub(super) async fn commit(
    c: &mut sqlx::PgConnection,
    appends: &[&Append],
    now: i64,
    known: &mut Known,
) -> Result<Runs, sqlx::Error> {
    let done = call(c, appends, now, known).await;
    match done {
        Ok((looked, ids)) => {
            known.committed(appends, &looked, &ids);
            Ok(super::fenced(appends, &looked))
        }
        Err(e) => {
            known.forget(appends);
            Err(e)
        }
    }
}

/// Calls the function in a transaction: each append's run as it was, and the row it wrote.
async fn call(
    c: &mut sqlx::PgConnection,
    appends: &[&Append],
    now: i64,
    known: &Known,
) -> Result<(Vec<Looked>, Vec<Option<i64>>), sqlx::Error> {
    let n = appends.len();
    // One array per argument, one element per append; and for what few appends do (take a
    // lease, start a run, end it, give a lease back), their places in the batch (from 1)
    // and what goes with them.
    fn each<'a, T>(appends: &[&'a Append], f: impl Fn(&'a Append) -> T) -> Vec<T> {
        appends.iter().map(|a| f(a)).collect()
    }
    fn places<'a>(appends: &[&'a Append], f: impl Fn(&'a Append) -> bool) -> Vec<i32> {
        (1..)
            .zip(appends)
            .filter(|(_, a)| f(a))
            .map(|(i, _)| i)
            .collect()
    }
    let tails = each(appends, |a| known.tail(a));
    let runs = each(appends, |a| a.run_id.as_str());
    let holders = each(appends, |a| a.holder.as_deref());
    let kinds = each(appends, |a| a.kind.as_str());
    let bodies = each(appends, |a| a.body.as_str());
    let counts = each(appends, |a| a.count as i64);
    let known_seq: Vec<Option<i64>> = tails.iter().map(|t| t.map(|t| t.last)).collect();
    let known_id: Vec<Option<i64>> = tails.iter().map(|t| t.and_then(|t| t.last_id)).collect();
    let finish_at = places(appends, |a| a.finished);
    let take_at = places(appends, |a| a.take_lease.is_some());
    let expiries: Vec<i64> = appends.iter().filter_map(|a| a.take_lease).collect();
    let starts: Vec<&super::Start> = appends.iter().filter_map(|a| a.start.as_ref()).collect();
    let start_at = places(appends, |a| a.start.is_some());
    let sessions: Vec<Option<&str>> = starts.iter().map(|s| s.session.as_deref()).collect();
    let metas: Vec<Option<&str>> = starts.iter().map(|s| s.meta.as_deref()).collect();
    let revisions: Vec<Option<i64>> = starts.iter().map(|s| s.session_revision).collect();
    let release_at = places(appends, |a| a.release);
    let me = crate::lease::me();
    // In a transaction of its own, not alone: a call alone commits in the server even when
    // the process that sent it is killed while it runs, and the run would then appear after
    // its process was seen gone. The commit is a message of its own, sent only once the
    // answer is in.
    let mut tx = sqlx::Connection::begin(c).await?;
    let (fenced, last, ids): (Vec<bool>, Vec<i64>, Vec<Option<i64>>) = sqlx::query_as(APPEND_BATCH)
        .bind(runs)
        .bind(holders)
        .bind(kinds)
        .bind(bodies)
        .bind(counts)
        .bind(known_seq)
        .bind(known_id)
        .bind(take_at)
        .bind(expiries)
        .bind(me.host.as_str())
        .bind(me.pid)
        .bind(me.start.as_str())
        .bind(start_at)
        .bind(sessions)
        .bind(metas)
        .bind(revisions)
        .bind(finish_at)
        .bind(release_at)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
    if fenced.len() != n || last.len() != n || ids.len() != n {
        return Err(sqlx::Error::Protocol(format!(
            "the batch's answer has {}, {} and {} runs of {n}",
            fenced.len(),
            last.len(),
            ids.len()
        )));
    }
    tx.commit().await?;
    let looked = fenced
        .into_iter()
        .zip(last)
        .zip(&tails)
        .map(|((fenced, last), known)| Looked {
            fenced,
            tail: Tail {
                last,
                last_id: known.and_then(|t| t.last_id),
            },
        })
        .collect();
    Ok((looked, ids))
}
