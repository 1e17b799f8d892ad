//! The daemon's state: one SQLite database (WAL) in the state directory.
//! A domain's row holds what is needed to find it again after the daemon
//! restarts: its configuration (the typed [`DomainConfig`], as JSON), its
//! VMM's pid and that process's start time (so a reused pid is never
//! mistaken for it), and its lifecycle state.
//!
//! The schema's version is SQLite's `user_version`. Version 0 kept each
//! domain's xl.cfg text, file name, directory and `key=value` overrides,
//! parsed again on every use; opening such a database converts every row
//! once, through the function the daemon gives [`Db::open`].

use std::path::Path;

use domus_api::daemon::State;
use domus_api::domain::DomainConfig;
use rusqlite::{params, Connection, OptionalExtension};

/// How many lines the daemon log keeps (the oldest go first).
pub const LOG_LINES: i64 = 10_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub id: i64,
    /// `config.name`, read from the column that keeps names unique.
    pub name: String,
    pub config: DomainConfig,
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

/// A domain's configuration as schema version 0 kept it.
#[derive(Clone, Debug, PartialEq)]
pub struct Legacy {
    pub id: i64,
    pub name: String,
    pub cfg_text: String,
    pub cfg_file: String,
    pub cfg_dir: String,
    /// `key=value` settings that override the text's.
    pub overrides: Vec<String>,
}

/// Turns a version 0 row's configuration into its typed record.
pub type Upgrade<'a> = &'a dyn Fn(&Legacy) -> Result<DomainConfig, String>;

/// The schema's version this code writes.
const VERSION: i64 = 1;

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{path}: schema version {found} is newer than this Domus knows ({VERSION})")]
    Newer { path: String, found: i64 },
    #[error("converting domain {id} ({name})'s stored configuration: {msg}")]
    Upgrade { id: i64, name: String, msg: String },
}

fn json_error(col: usize, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        col,
        rusqlite::types::Type::Text,
        e.to_string().into(),
    )
}

impl Db {
    /// Opens (or makes) the database at `path`; a version 0 database is
    /// converted with `upgrade`, all rows or none.
    pub fn open(path: &Path, upgrade: Upgrade<'_>) -> Result<Self, OpenError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > VERSION {
            return Err(OpenError::Newer {
                path: path.display().to_string(),
                found: version,
            });
        }
        let db = Self { conn };
        if db.has_column("domains", "cfg_text")? {
            db.upgrade_from_0(upgrade)?;
        }
        db.conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS domains (
                id INTEGER PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                config TEXT NOT NULL,
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
            );
            CREATE TABLE IF NOT EXISTS settings (
                key TEXT PRIMARY KEY,
                value TEXT NOT NULL
            );",
        )?;
        db.conn.pragma_update(None, "user_version", VERSION)?;
        Ok(db)
    }

    fn has_column(&self, table: &str, column: &str) -> rusqlite::Result<bool> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let names = st.query_map([], |r| r.get::<_, String>(0))?;
        for n in names {
            if n? == column {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Version 0 to 1: each row's configuration text, file, directory and
    /// overrides become one typed record, in one transaction.
    fn upgrade_from_0(&self, upgrade: Upgrade<'_>) -> Result<(), OpenError> {
        let tx = self.conn.unchecked_transaction()?;
        let legacy: Vec<Legacy> = {
            let mut st = tx.prepare(
                "SELECT id, name, cfg_text, cfg_file, cfg_dir, overrides FROM domains ORDER BY id",
            )?;
            let rows = st.query_map([], |r| {
                let overrides: String = r.get(5)?;
                Ok(Legacy {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    cfg_text: r.get(2)?,
                    cfg_file: r.get(3)?,
                    cfg_dir: r.get(4)?,
                    overrides: serde_json::from_str(&overrides).map_err(|e| json_error(5, e))?,
                })
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        tx.execute_batch("ALTER TABLE domains ADD COLUMN config TEXT NOT NULL DEFAULT ''")?;
        for l in &legacy {
            let c = upgrade(l).map_err(|msg| OpenError::Upgrade {
                id: l.id,
                name: l.name.clone(),
                msg,
            })?;
            let json = serde_json::to_string(&c).map_err(|e| json_error(2, e))?;
            tx.execute(
                "UPDATE domains SET config = ?2 WHERE id = ?1",
                params![l.id, json],
            )?;
        }
        for col in ["cfg_text", "cfg_file", "cfg_dir", "overrides"] {
            tx.execute_batch(&format!("ALTER TABLE domains DROP COLUMN {col}"))?;
        }
        tx.pragma_update(None, "user_version", 1)?;
        Ok(tx.commit()?)
    }

    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        let config: String = r.get(2)?;
        Ok(Row {
            id: r.get(0)?,
            name: r.get(1)?,
            config: serde_json::from_str(&config).map_err(|e| json_error(2, e))?,
            pid: r.get(3)?,
            start_time: r.get(4)?,
            state: {
                let s: String = r.get(5)?;
                State::parse(&s)
                    .ok_or_else(|| json_error(5, format!("unknown domain state '{s}'")))?
            },
            restarts: r.get(6)?,
            memory_mib: r.get(7)?,
        })
    }

    const COLS: &'static str = "id, name, config, pid, start_time, state, restarts, memory_mib";

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
        let config = serde_json::to_string(&r.config).map_err(|e| json_error(2, e))?;
        tx.execute(
            "INSERT INTO domains (id, name, config, state, memory_mib)
             VALUES (?1, ?2, ?3, 'creating', ?4)",
            params![id, r.config.name, config, r.memory_mib],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Records domain `id`'s VMM process as started; its state stays what
    /// it was (creating, restarting) until its API has answered.
    pub fn set_pid(&self, id: i64, pid: i64, start_time: i64) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET pid = ?2, start_time = ?3 WHERE id = ?1",
            params![id, pid, start_time],
        )?;
        Ok(())
    }

    /// Marks domain `id` running once its VMM's API has answered; only from
    /// creating or restarting (a destroy under way keeps its state).
    pub fn set_running(&self, id: i64) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE domains SET state = 'running' WHERE id = ?1 AND state IN ('creating', 'restarting')",
            [id],
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

    /// Stores domain `id`'s configuration; its name is the row's, so a
    /// rename is this with a new `config.name`.
    pub fn set_config(&self, id: i64, config: &DomainConfig) -> rusqlite::Result<()> {
        let json = serde_json::to_string(config).map_err(|e| json_error(2, e))?;
        self.conn.execute(
            "UPDATE domains SET name = ?2, config = ?3 WHERE id = ?1",
            params![id, config.name, json],
        )?;
        Ok(())
    }

    pub fn delete(&self, id: i64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM domains WHERE id = ?1", [id])?;
        Ok(())
    }

    /// A host-wide setting the daemon keeps (its JSON text), if it was
    /// ever set. (An older daemon ignores the table: it adds no column.)
    pub fn setting(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
    }

    pub fn set_setting(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
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

/// A configuration of the least a domain has, for tests.
#[cfg(test)]
pub(crate) fn test_config(name: &str) -> DomainConfig {
    DomainConfig {
        name: name.into(),
        memory_mib: 256,
        maxmem_mib: 256,
        vcpus: 1,
        cpus: None,
        cpu_weight: 256,
        cap: 0,
        kernel: "/k".into(),
        ramdisk: None,
        cmdline: String::new(),
        disks: Vec::new(),
        vifs: Vec::new(),
        vsock_cid: None,
        mergeable: false,
        cpuid: Vec::new(),
        on_poweroff: domus_api::domain::Action::Destroy,
        on_reboot: domus_api::domain::Action::Restart,
        on_crash: domus_api::domain::Action::Destroy,
        image: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str) -> Row {
        Row {
            id: 0,
            name: name.into(),
            config: test_config(name),
            pid: None,
            start_time: None,
            state: State::Creating,
            restarts: 0,
            memory_mib: 256,
        }
    }

    fn no_upgrade(l: &Legacy) -> Result<DomainConfig, String> {
        Err(format!("unexpected version 0 row {}", l.id))
    }

    #[test]
    fn domains_survive_reopening_and_names_are_unique() {
        let dir = std::env::temp_dir().join(format!("domus-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        {
            let db = Db::open(&path, &no_upgrade).unwrap();
            assert_eq!(db.insert(&row("a")).unwrap(), 1);
            assert_eq!(db.insert(&row("b")).unwrap(), 2);
            assert!(db.insert(&row("a")).is_err(), "duplicate name");
            db.set_pid(1, 1234, 99).unwrap();
            assert_eq!(db.get(1).unwrap().unwrap().state, State::Creating);
            db.set_running(1).unwrap();
            db.set_state(2, State::Destroying).unwrap();
            db.set_running(2).unwrap();
            assert_eq!(db.get(2).unwrap().unwrap().state, State::Destroying);
            db.set_config(1, &test_config("a2")).unwrap();
            assert!(
                db.set_config(1, &test_config("b")).is_err(),
                "rename onto a name in use"
            );
            db.delete(2).unwrap();
            assert_eq!(db.insert(&row("c")).unwrap(), 3, "ids are never reused");
            db.log("hello");
        }
        let db = Db::open(&path, &no_upgrade).unwrap();
        let all = db.all().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].pid, all[0].state), (Some(1234), State::Running));
        assert_eq!(
            (all[0].name.as_str(), &all[0].config),
            ("a2", &test_config("a2"))
        );
        assert_eq!(all[1].state, State::Creating);
        assert_eq!(db.log_lines().unwrap()[0].1, "hello");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_log_keeps_its_last_lines() {
        let dir = std::env::temp_dir().join(format!("domus-db-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir.join("state.db"), &no_upgrade).unwrap();
        for i in 0..25 {
            db.log_keeping(&format!("line {i}"), 10);
        }
        let lines: Vec<String> = db.log_lines().unwrap().into_iter().map(|l| l.1).collect();
        let want: Vec<String> = (15..25).map(|i| format!("line {i}")).collect();
        assert_eq!(lines, want);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_version_0_database_is_converted_once_and_whole() {
        let dir = std::env::temp_dir().join(format!("domus-db-v0-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let make = |path: &Path| {
            let c = Connection::open(path).unwrap();
            c.execute_batch(
                r#"CREATE TABLE domains (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                    cfg_text TEXT NOT NULL, cfg_file TEXT NOT NULL, cfg_dir TEXT NOT NULL,
                    overrides TEXT NOT NULL, pid INTEGER, start_time INTEGER,
                    state TEXT NOT NULL, restarts INTEGER NOT NULL DEFAULT 0,
                    memory_mib INTEGER NOT NULL);
                 CREATE TABLE ids (last INTEGER NOT NULL);
                 INSERT INTO ids VALUES (7);
                 CREATE TABLE log (at REAL NOT NULL, msg TEXT NOT NULL);
                 INSERT INTO domains VALUES (3, 'a', 'name=''a''', 'a.cfg', '/etc',
                    '["memory=512"]', 42, 9, 'running', 1, 512);
                 INSERT INTO domains VALUES (7, 'b', 'name=''b''', 'b.cfg', '/etc',
                    '[]', NULL, NULL, 'shutdown', 0, 256);"#,
            )
            .unwrap();
        };
        // Stands for the daemon's conversion (xl.cfg parsing): uses the
        // overrides and the directory, and fails for domain b.
        let upgrade = |l: &Legacy| -> Result<DomainConfig, String> {
            if l.name == "b" {
                return Err("b.cfg: broken".into());
            }
            let mut c = test_config(&l.name);
            c.memory_mib = if l.overrides == ["memory=512"] {
                512
            } else {
                1
            };
            c.kernel = Path::new(&l.cfg_dir).join(&l.cfg_file);
            Ok(c)
        };

        // A row that cannot be converted: the error names it and nothing
        // changes.
        let failing = dir.join("failing.db");
        make(&failing);
        let e = Db::open(&failing, &upgrade).err().unwrap().to_string();
        assert!(
            e.contains("domain 7 (b)") && e.contains("b.cfg: broken"),
            "{e}"
        );
        let c = Connection::open(&failing).unwrap();
        let old: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM pragma_table_info('domains') WHERE name = 'cfg_text'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(old, 1, "the old columns are still there");

        let path = dir.join("state.db");
        make(&path);
        let all_fine = |l: &Legacy| -> Result<DomainConfig, String> {
            let mut c = upgrade(&Legacy {
                name: "a".into(),
                ..l.clone()
            })?;
            c.name = l.name.clone();
            Ok(c)
        };
        let db = Db::open(&path, &all_fine).unwrap();
        let all = db.all().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[0].id, all[0].pid, all[0].start_time, all[0].state),
            (3, Some(42), Some(9), State::Running)
        );
        assert_eq!(all[0].config.memory_mib, 512);
        assert_eq!(all[0].config.kernel, Path::new("/etc/a.cfg"));
        assert_eq!(
            (
                all[1].name.as_str(),
                all[1].config.name.as_str(),
                all[1].state
            ),
            ("b", "b", State::Shutdown)
        );
        assert_eq!(
            db.insert(&row("c")).unwrap(),
            8,
            "ids go on from where they were"
        );
        drop(db);
        // Opened again: version 1, nothing to convert.
        let db = Db::open(&path, &no_upgrade).unwrap();
        assert_eq!(db.all().unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("domus-db-new-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", VERSION + 1)
            .unwrap();
        let e = Db::open(&path, &no_upgrade).err().unwrap();
        assert!(matches!(e, OpenError::Newer { found: 2, .. }), "{e}");
        let c = Connection::open(&path).unwrap();
        let tables: i64 = c
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0, "nothing was made");
        let _ = std::fs::remove_dir_all(dir);
    }
}
