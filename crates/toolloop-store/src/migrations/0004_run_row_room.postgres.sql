-- toolloop store, version 4 (PostgreSQL): a run's row is updated at every step it writes (its
-- record count), so its pages keep room for the new versions: an update that finds room on its
-- page touches no index (a heap-only tuple), and the page's dead versions are reclaimed in place.
-- Pages written from now on are filled to half.
ALTER TABLE toolloop_runs SET (fillfactor = 50);
