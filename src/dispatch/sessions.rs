//! Session-Key → the agent's own session id, in one small JSON file per agent, so that a
//! dispatch with the same `X-AAMP-Session-Key` continues the same agent session, across
//! restarts too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Debug)]
pub struct SessionStore {
    path: PathBuf,
    map: Mutex<Option<BTreeMap<String, String>>>,
}

impl SessionStore {
    pub fn new(path: PathBuf) -> SessionStore {
        SessionStore {
            path,
            map: Mutex::new(None),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, String>) -> T) -> T {
        let mut guard = self.map.lock().expect("session map lock");
        let map = guard.get_or_insert_with(|| {
            std::fs::read(&self.path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default()
        });
        f(map)
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.with(|m| m.get(key).cloned())
    }

    /// Records `id` for `key` and writes the file (atomically, mode 0600).
    pub fn set(&self, key: &str, id: &str) -> std::io::Result<()> {
        let text = self.with(|m| {
            m.insert(key.to_string(), id.to_string());
            serde_json::to_vec_pretty(m).expect("a string map serializes")
        });
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&text)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_survive_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent/sessions.json");
        let store = SessionStore::new(path.clone());
        assert_eq!(store.get("k"), None);
        store.set("k", "native-1").unwrap();
        store.set("other", "native-2").unwrap();
        let again = SessionStore::new(path);
        assert_eq!(again.get("k").as_deref(), Some("native-1"));
        assert_eq!(again.get("other").as_deref(), Some("native-2"));
    }
}
