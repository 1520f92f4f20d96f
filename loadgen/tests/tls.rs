//! HTTPS: runs against the mock over TLS (a test CA and a leaf certificate it signed) time
//! like plain runs; `--insecure` takes a self-signed certificate; an unknown issuer and a
//! wrong host name each fail at start-up with their own message, before any request; the
//! scraper reads `/metrics` over https.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use loadgen::load::plan::Plan;
use loadgen::load::schedule::{Arrival, Extent, ScheduleSpec};
use loadgen::load::workload::prompt::PromptBuilder;
use loadgen::load::workload::{prefixed_blocks, PromptSource, RequestSpec};
use loadgen::mock::{self, MockConfig};
use loadgen::run::send::{send_plan, RunOutcome, SendOptions};
use loadgen::wire::backend::Backend;
use loadgen::wire::target::Target;
use loadgen::wire::tls::{server_config, TlsOptions, TlsSettings};

/// A CA, and a leaf certificate it signed for `names`, as PEM files in `dir`: `ca.pem`,
/// `leaf.pem`, `leaf.key`.
fn issue(dir: &Path, names: &[&str]) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "loadgen test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).unwrap();
}

fn plan(rate: f64, secs: f64, output_len: u32) -> Plan {
    let times = ScheduleSpec {
        arrival: Arrival::Poisson,
        rate,
        ramp_up: None,
    }
    .generate(Extent::Until(secs), 3)
    .unwrap();
    Plan::open(times, |i| RequestSpec {
        input_len: 16,
        output_len,
        prefix_group: None,
        prompt: PromptSource::Blocks(prefixed_blocks(1, i, 16, None)),
        model: None,
        class: None,
    })
}

fn target(base_url: String, tls: Option<TlsSettings>) -> Target {
    Target {
        base_url,
        backend: Backend::Chat,
        model: "loadgen-mock".into(),
        headers: Vec::new(),
        api_key: None,
        timeout: Duration::from_secs(30),
        ignore_eos: true,
        min_tokens: false,
        prompt_ids: false,
        continuous_usage: true,
        extra_body: None,
        tls,
    }
}

async fn run_plan(plan: Plan, target: Target) -> anyhow::Result<RunOutcome> {
    send_plan(
        Arc::new(plan),
        target,
        Arc::new(PromptBuilder::approximate()),
        SendOptions {
            out_dir: None,
            slos: Vec::new(),
            progress: false,
            stop: loadgen::run::stop::never_stop(),
            start_at: None,
        },
    )
    .await
}

fn settings(ca_cert: Option<&Path>, insecure: bool) -> TlsSettings {
    TlsSettings::new(&TlsOptions {
        ca_cert: ca_cert.map(Path::to_path_buf),
        insecure,
    })
    .unwrap()
}

/// Timing-sensitive tests run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_tls_times_like_a_plain_run() {
    let _guard = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    issue(dir.path(), &["localhost", "127.0.0.1"]);
    let tls = server_config(&dir.path().join("leaf.pem"), &dir.path().join("leaf.key")).unwrap();
    let mut medians = Vec::new();
    for secure in [false, true] {
        let (addr, handle) = mock::spawn(MockConfig {
            tls: secure.then(|| tls.clone()),
            ..MockConfig::default()
        })
        .await
        .unwrap();
        let (scheme, client) = if secure {
            (
                "https",
                Some(settings(Some(&dir.path().join("ca.pem")), false)),
            )
        } else {
            ("http", None)
        };
        let out = run_plan(
            plan(20.0, 2.0, 32),
            target(format!("{scheme}://{addr}"), client),
        )
        .await
        .unwrap();
        handle.shutdown().await;
        let m = &out.metrics;
        assert!(
            m.completed > 20 && m.failed == 0,
            "tls {secure}: {:?}",
            m.errors
        );
        assert!(
            (m.ttft.p50 - 50.0).abs() < 5.0,
            "tls {secure}: TTFT p50 {}",
            m.ttft.p50
        );
        assert!(
            (m.tpot.p50 - 10.0).abs() < 1.0,
            "tls {secure}: TPOT p50 {}",
            m.tpot.p50
        );
        assert_eq!(m.total_output_tokens, 32 * m.completed);
        medians.push(m.ttft.p50);
    }
    assert!(
        (medians[1] - medians[0]).abs() < 2.0,
        "TTFT p50 plain {} ms, TLS {} ms",
        medians[0],
        medians[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_problems_fail_at_start_up_with_their_own_message() {
    let _guard = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    issue(dir.path(), &["localhost", "127.0.0.1"]);
    let other = tempfile::tempdir().unwrap();
    issue(other.path(), &["example.test"]);
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The mock serves a certificate for example.test, signed by the other CA.
    let (addr, handle) = mock::spawn(MockConfig {
        tls: Some(
            server_config(
                &other.path().join("leaf.pem"),
                &other.path().join("leaf.key"),
            )
            .unwrap(),
        ),
        bodies: Some(bodies.clone()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let url = format!("https://{addr}");
    let error = |tls: TlsSettings| {
        let url = url.clone();
        async move {
            format!(
                "{:#}",
                run_plan(plan(20.0, 0.5, 4), target(url, Some(tls)))
                    .await
                    .err()
                    .unwrap()
            )
        }
    };
    // An issuer the client does not trust (only the webpki roots, or another CA).
    let e = error(settings(None, false)).await;
    assert!(
        e.contains("signed by an issuer loadgen does not trust") && e.contains("--ca-cert"),
        "{e}"
    );
    let e = error(settings(Some(&dir.path().join("ca.pem")), false)).await;
    assert!(e.contains("does not trust") && e.contains("ca.pem"), "{e}");
    // The right CA, the wrong name: the certificate names example.test, not 127.0.0.1.
    let e = error(settings(Some(&other.path().join("ca.pem")), false)).await;
    assert!(e.contains("not valid for the host name `127.0.0.1`"), "{e}");
    assert!(bodies.lock().unwrap().is_empty(), "no request was sent");
    // An expired certificate, from a CA the client trusts.
    let expired_dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf_params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    leaf_params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let (cert, key, ca_file) = (
        expired_dir.path().join("leaf.pem"),
        expired_dir.path().join("leaf.key"),
        expired_dir.path().join("ca.pem"),
    );
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let (expired_addr, expired) = mock::spawn(MockConfig {
        tls: Some(server_config(&cert, &key).unwrap()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let e = format!(
        "{:#}",
        run_plan(
            plan(20.0, 0.5, 4),
            target(
                format!("https://{expired_addr}"),
                Some(settings(Some(&ca_file), false))
            )
        )
        .await
        .err()
        .unwrap()
    );
    assert!(e.contains("its certificate has expired"), "{e}");
    expired.shutdown().await;
    // --insecure takes it.
    let out = run_plan(
        plan(20.0, 0.5, 4),
        target(url.clone(), Some(settings(None, true))),
    )
    .await
    .unwrap();
    assert!(out.metrics.completed > 0 && out.metrics.failed == 0);
    handle.shutdown().await;
    // A self-signed certificate with --insecure.
    let pair = loadgen::wire::tls::self_signed_pair().unwrap();
    let (addr, handle) = mock::spawn(MockConfig {
        tls: Some(pair.server.clone()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let out = run_plan(
        plan(20.0, 0.5, 4),
        target(format!("https://{addr}"), Some(settings(None, true))),
    )
    .await
    .unwrap();
    assert!(out.metrics.completed > 0 && out.metrics.failed == 0);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scraper_reads_metrics_over_https() {
    let _guard = SERIAL.lock().await;
    let pair = loadgen::wire::tls::self_signed_pair().unwrap();
    let (addr, handle) = mock::spawn(MockConfig {
        tls: Some(pair.server.clone()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scraper = loadgen::wire::scrape::Scraper::start(loadgen::wire::scrape::ScrapeTarget {
        base_url: format!("https://{addr}"),
        headers: Vec::new(),
        api_key: None,
        interval: Duration::from_millis(100),
        out_dir: dir.path().to_path_buf(),
        start_at: None,
        tls: Some(pair.client.clone()),
    });
    tokio::time::sleep(Duration::from_millis(350)).await;
    scraper.finish().await;
    handle.shutdown().await;
    let scrapes = reports::server_metrics::read_scrapes(dir.path()).unwrap();
    assert!(scrapes.len() >= 2, "{} scrapes", scrapes.len());
    assert!(scrapes[0]
        .values
        .contains_key("loadgen_mock_requests_total"));
}
