//! Child processes (started so that they die with the test), their logs, scratch
//! directories and free ports.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use tempfile::TempDir;

/// Starts `exe` with `args` in `dir`, stdout and stderr appended to `log`, through
/// `setpriv --pdeathsig KILL` when available (so it dies with the thread that started it).
pub(super) fn spawn(exe: &Path, args: &[String], dir: &Path, log: &Path) -> std::io::Result<Child> {
    let log = File::options().create(true).append(true).open(log)?;
    let mut cmd = if has_setpriv() {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    };
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    cmd.spawn()
}

/// Kills `child` and waits for it.
pub(super) fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn has_setpriv() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

/// A fresh directory for one cluster, on `/dev/shm` when possible. Directories left
/// behind by test processes that were killed (so never ran `Drop`) are removed first.
pub(super) fn scratch_dir(name: &str) -> TempDir {
    scratch_dir_cleaned();
    let dir = create_scratch_dir(name);
    fs::write(dir.path().join("owner.pid"), std::process::id().to_string())
        .expect("write owner.pid");
    dir
}

/// Removes, once per process, the scratch directories of test processes that are gone.
fn scratch_dir_cleaned() {
    static CLEANED: OnceLock<()> = OnceLock::new();
    CLEANED.get_or_init(|| {
        for root in [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()] {
            remove_stale_dirs(&root);
        }
    });
}

fn remove_stale_dirs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // A node's folder holds mounts and its Pods' processes: the node sweep
        // (`node.rs`) tears it down first.
        let is_ours = name.starts_with("mcs-k8s-") && !name.starts_with("mcs-k8s-node-");
        let Ok(pid) = fs::read_to_string(path.join("owner.pid")) else {
            continue;
        };
        if is_ours && !Path::new("/proc").join(pid.trim()).exists() {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// [`scratch_dir`] on the disk (the temporary directory), never in memory: for a node,
/// whose kubelet needs the filesystem of its image store to be a block device's.
pub(super) fn scratch_dir_on_disk(name: &str) -> TempDir {
    scratch_dir_cleaned();
    let dir = tempfile::Builder::new()
        .prefix(&format!("mcs-k8s-{name}-"))
        .tempdir()
        .expect("create temp dir");
    fs::write(dir.path().join("owner.pid"), std::process::id().to_string())
        .expect("write owner.pid");
    dir
}

fn create_scratch_dir(name: &str) -> TempDir {
    let prefix = format!("mcs-k8s-{name}-");
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = b.tempdir_in(shm)
    {
        return d;
    }
    b.tempdir().expect("create temp dir")
}

/// `n` distinct free loopback ports, never handed out twice in this process.
pub(super) fn free_ports(n: usize) -> Vec<u16> {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut used = USED.lock().unwrap();
    let used = used.get_or_insert_with(HashSet::new);
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        listeners.push(l);
        if used.insert(port) {
            ports.push(port);
        }
    }
    ports
}

/// The last `lines` lines of the log at `path` (at most its last 64 KiB).
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
