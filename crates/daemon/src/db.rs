//! The daemon's state: one SQLite database (WAL) in the state directory.
//! A domain's row holds what is needed to find it again after the daemon
//! restarts: its configuration as given (text, file, directory, command-line
//! overrides), its VMM's pid and that process's start time (so a reused
//! pid is never mistaken for it), and its lifecycle state.

use std::path::Path;

use domus_api::daemon::State;
use rusqlite::{params, Connection, OptionalExtension};

/// How many lines the daemon log keeps (the oldest go first).
pub const LOG_LINES: i64 = 10_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub id: i64,
    pub name: String,
    pub cfg_text: String,
    pub cfg_file: String,
    pub cfg_dir: String,
    /// JSON array of `key=value` strings.
    pub overrides: String,
    pub pid: Option<i64>,
    /// The VMM's start time in clock ticks since boot (/proc/PID/stat).
    pub start_time: Option<i64>,
    /// Creating, Running, Restarting, Destroying, Shutdown or Crashed (a
    /// paused domain is Running here; pausing is the VMM's).
    pub state: State,
    pub restarts: i64,
    pub memory_mib: i64,
}

pub struct Db {
    conn: Connection,
}

impl Db {
    pub fn open(path: &Path) -> rusqlite::Result<Self> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS domains (
                id INTEGER PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                cfg_text TEXT NOT NULL,
                cfg_file TEXT NOT NULL,
                cfg_dir TEXT NOT NULL,
                overrides TEXT NOT NULL,
                pid INTEGER,
                start_time INTEGER,
                state TEXT NOT NULL,
                restarts INTEGER NOT NULL DEFAULT 0,
                memory_mib INTEGER NOT NULL
            );
            CREATE TABLE IF NOT EXISTS ids (last INTEGER NOT NULL);
            INSERT INTO ids (last) SELECT COALESCE(MAX(id), 0) FROM domains
                WHERE NOT EXISTS (SELECT 1 FROM ids);
            CREATE TABLE IF NOT EXISTS log (
                at REAL NOT NULL,
                msg TEXT NOT NULL
            );",
        )?;
        Ok(Self { conn })
    }

    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        Ok(Row {
            id: r.get(0)?,
            name: r.get(1)?,
            cfg_text: r.get(2)?,
            cfg_file: r.get(3)?,
            cfg_dir: r.get(4)?,
            overrides: r.get(5)?,
            pid: r.get(6)?,
            start_time: r.get(7)?,
            state: {
                let s: String = r.get(8)?;
                State::parse(&s).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(
                        8,
                        rusqlite::types::Type::Text,
                        format!("unknown domain state '{s}'").into(),
                    )
                })?
            },
            restarts: r.get(9)?,
            memory_mib: r.get(10)?,
        })
    }

    const COLS: &'static str = "id, name, cfg_text, cfg_file, cfg_dir, overrides, pid, start_time, state, restarts, memory_mib";

    pub fn all(&self) -> rusqlite::Result<Vec<Row>> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {} FROM domains ORDER BY id", Self::COLS))?;
        let rows = st.query_map([], Self::row)?;
        rows.collect()
    }

    pub fn get(&self, id: i64) -> rusqlite::Result<Option<Row>> {
        self.conn
            .query_row(
                &format!("SELECT {} FROM domains WHERE id = ?1", Self::COLS),
                [id],
                Self::row,
            )
            .optional()
    }

    /// Inserts a new domain in state `creating` and returns its id. Ids
    /// start at 1 (0 is the host) and are never reused, so nothing left
    /// over from a destroyed domain can be mistaken for a new one's.
    pub fn insert(&self, r: &Row) -> rusqlite::Result<i64> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute("UPDATE ids SET last = last + 1", [])?;
        let id: i64 = tx.query_row("SELECT last FROM ids", [], |row| row.get(0))?;
        tx.execute(
            "INSERT INTO domains (id, name, cfg_text, cfg_file, cfg_dir, overrides, state, memory_mib)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'creating', ?7)",
            params![id, r.name, r.cfg_text, r.cfg_file, r.cfg_dir, r.overrides, r.memory_mib],
        )?;
        tx.commit()?;
        Ok(id)
    }

    pub fn set_running(&self, id: i64, pid: i64, start_time: i64) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET pid = ?2, start_time = ?3, state = 'running' WHERE id = ?1",
            params![id, pid, start_time],
        )?;
        Ok(())
    }

    pub fn set_state(&self, id: i64, state: State) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET state = ?2 WHERE id = ?1",
            params![id, state.as_str()],
        )?;
        Ok(())
    }

    pub fn set_memory(&self, id: i64, mib: i64) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET memory_mib = ?2 WHERE id = ?1",
            params![id, mib],
        )?;
        Ok(())
    }

    pub fn count_restart(&self, id: i64) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET restarts = restarts + 1 WHERE id = ?1",
            [id],
        )?;
        Ok(())
    }

    pub fn set_overrides(&self, id: i64, overrides: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET overrides = ?2 WHERE id = ?1",
            params![id, overrides],
        )?;
        Ok(())
    }

    pub fn rename(&self, id: i64, name: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET name = ?2 WHERE id = ?1",
            params![id, name],
        )?;
        Ok(())
    }

    pub fn delete(&self, id: i64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM domains WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Appends a line to the daemon log (`domus dmesg`), which keeps the
    /// last [`LOG_LINES`] lines.
    pub fn log(&self, msg: &str) {
        self.log_keeping(msg, LOG_LINES);
    }

    fn log_keeping(&self, msg: &str, keep: i64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let _ = self.conn.execute(
            "INSERT INTO log (at, msg) VALUES (?1, ?2)",
            params![now, msg],
        );
        // Rows are numbered in order (rowid), so the oldest go first: a
        // range delete on the table's own key.
        let _ = self.conn.execute(
            "DELETE FROM log WHERE rowid <= (SELECT MAX(rowid) FROM log) - ?1",
            [keep],
        );
    }

    pub fn log_lines(&self) -> rusqlite::Result<Vec<(f64, String)>> {
        let mut st = self
            .conn
            .prepare("SELECT at, msg FROM log ORDER BY rowid")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str) -> Row {
        Row {
            id: 0,
            name: name.into(),
            cfg_text: "name='x'".into(),
            cfg_file: "x.cfg".into(),
            cfg_dir: "/".into(),
            overrides: "[]".into(),
            pid: None,
            start_time: None,
            state: State::Creating,
            restarts: 0,
            memory_mib: 256,
        }
    }

    #[test]
    fn domains_survive_reopening_and_names_are_unique() {
        let dir = std::env::temp_dir().join(format!("domus-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        {
            let db = Db::open(&path).unwrap();
            assert_eq!(db.insert(&row("a")).unwrap(), 1);
            assert_eq!(db.insert(&row("b")).unwrap(), 2);
            assert!(db.insert(&row("a")).is_err(), "duplicate name");
            db.set_running(1, 1234, 99).unwrap();
            db.delete(2).unwrap();
            assert_eq!(db.insert(&row("c")).unwrap(), 3, "ids are never reused");
            db.log("hello");
        }
        let db = Db::open(&path).unwrap();
        let all = db.all().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].pid, all[0].state), (Some(1234), State::Running));
        assert_eq!(all[1].state, State::Creating);
        assert_eq!(db.log_lines().unwrap()[0].1, "hello");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_log_keeps_its_last_lines() {
        let dir = std::env::temp_dir().join(format!("domus-db-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir.join("state.db")).unwrap();
        for i in 0..25 {
            db.log_keeping(&format!("line {i}"), 10);
        }
        let lines: Vec<String> = db.log_lines().unwrap().into_iter().map(|l| l.1).collect();
        let want: Vec<String> = (15..25).map(|i| format!("line {i}")).collect();
        assert_eq!(lines, want);
        let _ = std::fs::remove_dir_all(dir);
    }
}
