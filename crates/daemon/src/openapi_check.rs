//! The daemon's OpenAPI document (`api/daemon.openapi.json`) checked
//! against the `domus-api` types its server writes and reads: every
//! answer's and request's fields, their JSON types, which may be null, and
//! (for answers) that all are required. (Test-only.)

use domus_api::daemon::*;
use domus_api::openapi::check_schema;
use domus_api::vmm::Unplugging;
use domus_api::ErrorBody;
use serde_json::Value;

use crate::api::OPENAPI;

fn sample<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

fn domain(configured: bool) -> Domain {
    let text = |s: &str| configured.then(|| s.to_string());
    Domain {
        id: 1,
        name: "a".into(),
        state: State::Running,
        pid: configured.then_some(7),
        memory_mib: 256,
        maxmem_mib: configured.then_some(512),
        vcpus: configured.then_some(2),
        cpu_weight: configured.then_some(256),
        cap: configured.then_some(0),
        cpu_time_s: 1.5,
        vcpu_time_s: 1.0,
        io_time_s: 0.5,
        vcpu_tids: vec![8, 9],
        restarts: 0,
        shutdown_requested: text("reboot"),
        on_poweroff: text("destroy"),
        on_reboot: text("restart"),
        on_crash: text("preserve"),
        vsock_cid: configured.then_some(3),
        vfr_passed: 12,
        vfr_dropped: 3,
    }
}

#[test]
fn the_answers_match_their_schemas() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let schemas = &doc["components"]["schemas"];
    let check = |name: &str, samples: &[Value]| {
        check_schema(&doc, name, &schemas[name], samples, true);
    };
    let domains = [sample(&domain(true)), sample(&domain(false))];
    check("Domain", &domains);
    let created = Created {
        domain: domain(true),
        warnings: vec!["x".into()],
    };
    check("Created", &[sample(&created)]);
    let cloned = Cloned {
        domains: vec![domain(true)],
        disks: vec!["/i/d-a-1.img".into()],
        elapsed_ms: 1.5,
    };
    check("Cloned", &[sample(&cloned)]);
    let info = Info {
        version: "0.1.0".into(),
        state_dir: "/var/lib/domus".into(),
        host_memory_mib: 4096,
        host_reserve_mib: 512,
        domain_memory_mib: 256,
        free_memory_mib: 3328,
        cpus: 2,
        cgroups: true,
        image_dirs: vec!["/var/lib/domus/images".into()],
        block_devices: Vec::new(),
        tls_fingerprint: Some("SHA256:00".into()),
        seccomp: true,
        jail_ids: Some(1_500_000_000),
    };
    let local = Info {
        tls_fingerprint: None,
        jail_ids: None,
        ..info.clone()
    };
    check("Info", &[sample(&info), sample(&local)]);
    let line = LogLine {
        at: 1.5,
        msg: "started".into(),
    };
    check("LogLine", &[sample(&line)]);
    let vcpu = |known: bool| Vcpu {
        name: "a".into(),
        id: 1,
        vcpu: 0,
        tid: 8,
        cpu: known.then_some(1),
        cpu_time_s: known.then_some(0.5),
        affinity: known.then(|| "0-1".into()),
    };
    check("Vcpu", &[sample(&vcpu(true)), sample(&vcpu(false))]);
    let sched = Sched {
        id: 1,
        name: "a".into(),
        weight: 256,
        cap: 0,
    };
    check("Sched", &[sample(&sched)]);
    let host_sched = |base| HostSched {
        tslice_ms: 30,
        base_slice_ns: base,
    };
    check(
        "HostSched",
        &[
            sample(&host_sched(Some(3_000_000))),
            sample(&host_sched(None)),
        ],
    );
    let saved = Saved {
        file: "/i/a.snap".into(),
        memory_file: "/i/a.snap.mem".into(),
        memory_bytes: 1,
        pages_stored: 1,
        paused_ms: 0.5,
        destroyed: true,
    };
    check("Saved", &[sample(&saved)]);
    let going = domus_api::vmm::MigrationStatus {
        state: domus_api::vmm::MigrationState::Copying,
        rounds: 2,
        bytes_sent: 3,
        dirty_pages: 4,
        mib_per_s: 5.5,
        expected_downtime_ms: 6.5,
        downtime_ms: Some(7.5),
        error: Some("x".into()),
    };
    check("MigrationStatus", &[sample(&going)]);
    let maxmem = |ram: Option<u64>| Maxmem {
        id: 1,
        name: "a".into(),
        maxmem_mib: 1024,
        memory_mib: 256,
        ram_mib: ram,
        at_next_start: ram.is_some(),
    };
    check(
        "Maxmem",
        &[sample(&maxmem(Some(512))), sample(&maxmem(None))],
    );
    let chunk = ConsoleChunk {
        file: 12,
        from: 0,
        next: 3,
        data: "ok\n".into(),
        ended: false,
    };
    check("ConsoleChunk", &[sample(&chunk)]);
    let taken = domus_api::vmm::ConsoleTaken { taken: 3 };
    check("ConsoleTaken", &[sample(&taken)]);
    let gone = Unplugging {
        unplugging: "vdb".into(),
        slot: 4,
    };
    check("Unplugging", &[sample(&gone)]);
    check("Error", &[sample(&ErrorBody { error: "x".into() })]);
}

#[test]
fn the_request_bodies_match_their_schemas() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let check = |m: &str, path: &str, sample: Value| {
        let schema = &doc["paths"][path][m]["requestBody"]["content"]["application/json"]["schema"];
        check_schema(&doc, &format!("{m} {path}"), schema, &[sample], false);
    };
    let create = CreateRequest {
        config: "name='a'".into(),
        file: Some("a.cfg".into()),
        dir: Some("/".into()),
        overrides: Some(vec!["memory=512".into()]),
    };
    check("post", "/v1/domains", sample(&create));
    let d = "/v1/domains/{dom}";
    check(
        "put",
        &format!("{d}/memory"),
        sample(&MemoryRequest { target_mib: 256 }),
    );
    check(
        "put",
        &format!("{d}/maxmem"),
        sample(&MaxmemRequest { maxmem_mib: 512 }),
    );
    check(
        "put",
        &format!("{d}/name"),
        sample(&RenameRequest { name: "b".into() }),
    );
    let spec = AttachRequest {
        spec: Some("/x,raw,xvdb,rw".into()),
    };
    let typed = domus_api::vmm::ConsoleInput {
        text: "root\r".into(),
    };
    check("post", &format!("{d}/console"), sample(&typed));
    check("put", &format!("{d}/block-attach"), sample(&spec));
    check("put", &format!("{d}/network-attach"), sample(&spec));
    for id in [NameOrNumber::Name("vdb".into()), NameOrNumber::Number(0)] {
        let detach = sample(&DetachRequest { id });
        check("put", &format!("{d}/block-detach"), detach.clone());
        check("put", &format!("{d}/network-detach"), detach);
    }
    for vcpu in [NameOrNumber::Number(1), NameOrNumber::Name("all".into())] {
        let pin = PinRequest {
            vcpu: Some(vcpu),
            cpus: "0-1".into(),
        };
        check("put", &format!("{d}/vcpu-pin"), sample(&pin));
    }
    let sched = SchedRequest {
        weight: Some(512),
        cap: Some(50),
    };
    check("put", &format!("{d}/sched"), sample(&sched));
    let tslice = HostSchedRequest {
        tslice_ms: Some(30),
    };
    check("put", "/v1/sched", sample(&tslice));
    let restore = RestoreRequest {
        file: "/i/a.snap".into(),
        name: Some("b".into()),
    };
    check("post", "/v1/restore", sample(&restore));
    let clone = CloneRequest {
        file: "/i/a.snap".into(),
        count: 16,
        prefix: Some("web".into()),
    };
    check("post", "/v1/clone", sample(&clone));
    let migrate = domus_api::daemon::MigrateRequest {
        to: "h:7000".into(),
        token: "t".into(),
        fingerprint: Some("SHA256:00".into()),
        ca_file: Some("/ca.pem".into()),
        downtime_ms: 300,
        max_rounds: 30,
    };
    check("post", &format!("{d}/migrate"), sample(&migrate));
}
