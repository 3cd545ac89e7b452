//! The model repository: `DIR/<name>/<version>/model.rbln` plus an
//! optional `DIR/<name>/config.json`. Models are loaded at start and by
//! the repository extension's load call, and dropped by unload (requests
//! in flight finish first: they hold the model).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::error::{Kind, Result, ServeError};
use crate::metrics::Metrics;
use crate::model::{Defaults, LoadedModel, Loader, ModelConfig};

/// What the repository knows of one model name.
#[derive(Clone)]
pub enum State {
    Ready(Arc<LoadedModel>),
    /// Not loaded: unloaded, or its load failed (the reason).
    Unavailable(String),
}

/// One row of the repository index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: String,
    /// "READY" or "UNAVAILABLE".
    pub state: &'static str,
    pub reason: String,
}

pub struct Repository {
    pub dir: PathBuf,
    loader: Box<dyn Loader>,
    defaults: Defaults,
    pub metrics: Arc<Metrics>,
    models: RwLock<BTreeMap<String, State>>,
    /// Loads and unloads one at a time.
    changing: Mutex<()>,
}

/// A model name a client may use: the name of a directory in the
/// repository (no path separators, no dot-names).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && !name.starts_with('.') && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl Repository {
    pub fn new(dir: PathBuf, loader: Box<dyn Loader>, defaults: Defaults, metrics: Arc<Metrics>) -> Self {
        Self { dir, loader, defaults, metrics, models: RwLock::new(BTreeMap::new()), changing: Mutex::new(()) }
    }

    /// Model names in the repository directory (sorted).
    pub fn scan(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| valid_name(n))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Versions of a model on disk (numeric directories holding model.rbln), ascending.
    pub fn versions(&self, name: &str) -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(self.dir.join(name))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("model.rbln").is_file())
                    .filter_map(|e| e.file_name().into_string().ok()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Load every model of the repository; failures are logged and kept in
    /// the index with their reason.
    pub fn load_all(&self) {
        for name in self.scan() {
            match self.load(&name) {
                Ok(m) => eprintln!(
                    "rbln-serve: loaded model '{name}' version {} ({} instance(s){}, queue {}, timeout {} ms)",
                    m.version,
                    m.instances,
                    m.devices.as_ref().map(|d| format!(" on each of devices {d:?}")).unwrap_or_default(),
                    m.max_queue,
                    m.timeout.as_millis()
                ),
                Err(e) => eprintln!("rbln-serve: model '{name}' not loaded: {e}"),
            }
        }
    }

    /// (Re)load a model: its config and its highest (or configured)
    /// version. Blocking (reads the file, loads the device).
    pub fn load(&self, name: &str) -> Result<Arc<LoadedModel>> {
        if !valid_name(name) || !self.dir.join(name).is_dir() {
            return Err(ServeError::not_found(format!("model '{name}' is not in the model repository")));
        }
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.load_locked(name);
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let old = match &r {
            Ok(m) => models.insert(name.to_string(), State::Ready(m.clone())),
            Err(e) => models.insert(name.to_string(), State::Unavailable(e.msg.clone())),
        };
        drop(models);
        self.metrics.model_ready.with_label_values(&[name]).set(r.is_ok() as i64);
        // The old instance goes once its requests finish (they hold it).
        drop(old);
        r
    }

    fn load_locked(&self, name: &str) -> Result<Arc<LoadedModel>> {
        let mdir = self.dir.join(name);
        let config = ModelConfig::read(&mdir).map_err(|e| ServeError::bad(format!("model '{name}': {e}")))?;
        let versions = self.versions(name);
        let version = match config.version {
            Some(v) if versions.contains(&v) => v,
            Some(v) => return Err(ServeError::bad(format!("model '{name}': config.json asks for version {v}, which has no {v}/model.rbln"))),
            None => *versions.last().ok_or_else(|| ServeError::bad(format!("model '{name}' has no version directory with a model.rbln (<name>/<version>/model.rbln)")))?,
        };
        let path = mdir.join(version.to_string()).join("model.rbln");
        let (spec, backend) = self.loader.load(name, &path, &config).map_err(|e| ServeError::bad(format!("model '{name}' version {version} failed to load: {e}")))?;
        let spec = match config.max_batch_size {
            Some(rows) => spec.batched(rows).map_err(|e| ServeError::bad(format!("model '{name}' version {version}: max_batch_size {rows}: {e}")))?,
            None => spec,
        };
        Ok(Arc::new(LoadedModel::new(name, version, path, spec, backend, &config, &self.defaults, self.metrics.clone())))
    }

    /// Unload a model (it stays in the index as UNAVAILABLE). Returns the
    /// instance so the caller decides where its teardown runs.
    pub fn unload(&self, name: &str) -> Result<Option<Arc<LoadedModel>>> {
        let _g = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let known = models.contains_key(name) || (valid_name(name) && self.dir.join(name).is_dir());
        if !known {
            return Err(ServeError::not_found(format!("model '{name}' is not in the model repository")));
        }
        let old = models.insert(name.to_string(), State::Unavailable("unloaded".into()));
        drop(models);
        self.metrics.model_ready.with_label_values(&[name]).set(0);
        Ok(match old {
            Some(State::Ready(m)) => Some(m),
            _ => None,
        })
    }

    /// False when a loaded model has lost every NPU it runs on.
    pub fn all_healthy(&self) -> bool {
        self.models.read().unwrap_or_else(|e| e.into_inner()).values().all(|s| !matches!(s, State::Ready(m) if !m.healthy()))
    }

    /// The model to serve `name` (and `version`, if given).
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<LoadedModel>> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let m = match models.get(name) {
            Some(State::Ready(m)) => m.clone(),
            Some(State::Unavailable(why)) => {
                return Err(ServeError::new(Kind::NotReady, format!("model '{name}' is not ready: {why}")));
            }
            None => return Err(ServeError::not_found(format!("unknown model '{name}'"))),
        };
        drop(models);
        if !m.healthy() {
            return Err(ServeError::new(Kind::NotReady, format!("model '{name}' is not ready: every NPU it runs on is lost")));
        }
        if let Some(v) = version.filter(|v| !v.is_empty()) {
            if v != m.version.to_string() {
                return Err(ServeError::not_found(format!("model '{name}' has no version '{v}' loaded (serving version {})", m.version)));
            }
        }
        Ok(m)
    }

    /// Whether `name` is a model the repository has heard of (for metric labels).
    pub fn is_known(&self, name: &str) -> bool {
        self.models.read().unwrap_or_else(|e| e.into_inner()).contains_key(name)
    }

    /// The repository index: every model directory, with its state.
    pub fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut names = self.scan();
        for k in models.keys() {
            if !names.contains(k) {
                names.push(k.clone());
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let e = match models.get(&name) {
                Some(State::Ready(m)) => IndexEntry { name, version: m.version.to_string(), state: "READY", reason: String::new() },
                Some(State::Unavailable(why)) => {
                    let v = self.versions(&name).last().map(|v| v.to_string()).unwrap_or_default();
                    IndexEntry { name, version: v, state: "UNAVAILABLE", reason: why.clone() }
                }
                None => {
                    let v = self.versions(&name).last().map(|v| v.to_string()).unwrap_or_default();
                    IndexEntry { name, version: v, state: "UNAVAILABLE", reason: "not loaded".into() }
                }
            };
            if !ready_only || e.state == "READY" {
                out.push(e);
            }
        }
        out
    }
}

/// The repository's directory must exist.
pub fn check_dir(dir: &Path) -> std::result::Result<(), String> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(format!("--model-repository {}: not a directory", dir.display()))
    }
}
