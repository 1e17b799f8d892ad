//! The per-domain API's OpenAPI document (`api/domain.openapi.json`)
//! checked against the `domus-api` types the server writes and reads: the
//! same fields, of the same JSON types, nullable where a field may be null,
//! required where the server always writes it. (Test-only.)

use serde_json::{json, Value};

use domus_api::openapi::check_schema;

use crate::api::OPENAPI;

#[test]
fn the_openapi_schemas_match_the_api_types() {
    use domus_api::vmm::*;
    use domus_api::ErrorBody;
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    fn sample<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap()
    }
    let schemas = &doc["components"]["schemas"];
    let info = DomainInfo {
        name: "a".into(),
        state: DomainState::Running,
        pid: 1,
        vcpus: 2,
        memory_mib: 256,
        uptime_s: 0.5,
        vcpu_tids: vec![3],
        devices: vec!["vda".into()],
    };
    check_schema(
        &doc,
        "DomainInfo",
        &schemas["DomainInfo"],
        &[sample(&info)],
        true,
    );
    let limited = RateLimit {
        bandwidth: Some(1),
        iops: None,
    };
    let dev = |rate_limit| DeviceInfo {
        id: "vda".into(),
        kind: "block".into(),
        info: json!({"path": "/x"}),
        counters: [("read_bytes".to_string(), 1)].into(),
        rate_limit,
    };
    let devices = [sample(&dev(Some(limited))), sample(&dev(None))];
    check_schema(&doc, "Device", &schemas["Device"], &devices, true);
    check_schema(
        &doc,
        "RateLimit",
        &schemas["RateLimit"],
        &[sample(&limited)],
        false,
    );
    let vector = domus_api::rings::VectorInfo {
        index: 1,
        enabled: true,
        masked: false,
        pending: false,
        fired: 3,
        routed: true,
    };
    let ring = |signalled_at, vector| domus_api::rings::RingInfo {
        device: "net0".into(),
        queue: 0,
        size: 256,
        event_idx: true,
        avail_idx: 1,
        avail_flags: 0,
        used_event: 1,
        used_idx: 1,
        used_flags: 0,
        avail_event: 1,
        signalled_at,
        vector,
    };
    let rings = [
        sample(&ring(Some(1), Some(vector.clone()))),
        sample(&ring(None, None)),
    ];
    check_schema(&doc, "Ring", &schemas["Ring"], &rings, true);
    check_schema(&doc, "Vector", &schemas["Vector"], &[sample(&vector)], true);
    let saved = SnapshotInfo {
        memory_bytes: 1,
        pages_stored: 1,
        state_bytes: 1,
        paused_ms: 0.5,
        paused: true,
    };
    check_schema(
        &doc,
        "SnapshotInfo",
        &schemas["SnapshotInfo"],
        &[sample(&saved)],
        true,
    );
    let going = MigrationStatus {
        state: MigrationState::Copying,
        rounds: 2,
        bytes_sent: 3,
        dirty_pages: 4,
        mib_per_s: 5.5,
        expected_downtime_ms: 6.5,
        downtime_ms: None,
        error: None,
    };
    let done = MigrationStatus {
        state: MigrationState::Completed,
        downtime_ms: Some(7.5),
        error: Some("x".into()),
        ..going.clone()
    };
    check_schema(
        &doc,
        "MigrationStatus",
        &schemas["MigrationStatus"],
        &[sample(&going), sample(&done)],
        true,
    );
    check_schema(
        &doc,
        "MigrateRequest",
        &schemas["MigrateRequest"],
        &[sample(&MigrateRequest::default())],
        false,
    );
    let balloon = |age| BalloonInfo {
        target_mib: 1,
        balloon_target_mib: 2,
        balloon_actual_mib: 3,
        actual_mib: 4,
        reported_bytes: 5,
        statistics: [("free_memory".to_string(), 6)].into(),
        statistics_age_s: age,
    };
    let balloons = [sample(&balloon(Some(0.5))), sample(&balloon(None))];
    check_schema(&doc, "Balloon", &schemas["Balloon"], &balloons, true);
    let error = ErrorBody { error: "x".into() };
    check_schema(&doc, "Error", &schemas["Error"], &[sample(&error)], true);
    // Bodies written inline in the paths.
    let op = |m: &str, p: &str| doc["paths"][p][m].clone();
    let request =
        |m: &str, p: &str| op(m, p)["requestBody"]["content"]["application/json"]["schema"].clone();
    let answer = |m: &str, p: &str, code: &str| {
        op(m, p)["responses"][code]["content"]["application/json"]["schema"].clone()
    };
    let plug = PlugRequest {
        disk: Some("/x,ro,id=d1,bw=1M".parse().unwrap()),
        net: Some("tap=t,mac=52:54:00:12:34:56".parse().unwrap()),
    };
    let (mut disk, mut net) = (plug.disk.clone().unwrap(), plug.net.clone().unwrap());
    (disk.passed, net.passed) = (Some(7), Some(8));
    check_schema(
        &doc,
        "DiskSpec",
        &schemas["DiskSpec"],
        &[sample(&disk)],
        false,
    );
    check_schema(&doc, "NetSpec", &schemas["NetSpec"], &[sample(&net)], false);
    check_schema(
        &doc,
        "PlugRequest",
        &request("post", "/v1/devices"),
        &[sample(&plug)],
        false,
    );
    let update = RateLimitUpdate {
        bandwidth: Some(Some(1)),
        iops: Some(None),
    };
    let path = "/v1/devices/{id}/rate-limit";
    check_schema(
        &doc,
        "RateLimitUpdate",
        &request("put", path),
        &[sample(&update)],
        false,
    );
    let target = BalloonTarget { target_mib: 1 };
    check_schema(
        &doc,
        "BalloonTarget",
        &request("put", "/v1/balloon"),
        &[sample(&target)],
        true,
    );
    let pressed = Pressed {
        pressed: "power-button".into(),
    };
    let schema = answer("put", "/v1/domain/power-button", "202");
    check_schema(&doc, "Pressed", &schema, &[sample(&pressed)], false);
    let input = ConsoleInput {
        text: "root\r".into(),
    };
    let path = "/v1/domain/console";
    check_schema(
        &doc,
        "ConsoleInput",
        &request("put", path),
        &[sample(&input)],
        true,
    );
    let taken = ConsoleTaken { taken: 5 };
    let schema = answer("put", path, "200");
    check_schema(&doc, "ConsoleTaken", &schema, &[sample(&taken)], true);
    let pin = VcpuPin {
        vcpu: Some(1),
        cpus: vec![0, 2],
    };
    let schema = request("put", "/v1/domain/vcpu-pin");
    check_schema(&doc, "VcpuPin", &schema, &[sample(&pin)], false);
    let pinned = VcpuAffinity {
        vcpu: 1,
        tid: 9,
        cpus: vec![0, 2],
    };
    check_schema(
        &doc,
        "VcpuAffinity",
        &schemas["VcpuAffinity"],
        &[sample(&pinned)],
        true,
    );
    let gone = Unplugging {
        unplugging: "vdb".into(),
        slot: 4,
    };
    let schema = answer("delete", "/v1/devices/{id}", "202");
    check_schema(&doc, "Unplugging", &schema, &[sample(&gone)], false);
}
