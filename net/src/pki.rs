//! The offline PKI: the cluster CA and the role certificates it signs, on
//! disk, and what a certificate says ([`role_of_cert`], [`node_id_of_cert`]).
//!
//! What `granary certs init` makes ([`init_split`]) is one folder per
//! identity: `ca/` (the CA's key, kept off the hosts), `admin/`, and under
//! `hosts/` a folder for each host identity holding the CA certificate and
//! that identity's `<name>.pem`/`<name>.key`, nothing else, so a host given
//! its folder can be no other identity. [`issue_from`] adds one more such
//! folder. [`init_cluster`] makes the all-in-one folder (CA key included)
//! that tests and single-machine harnesses use. Nothing is ever
//! overwritten, and key files are mode 0600.
//!
//! Every leaf certificate carries the DNS names `granary-<role>` (see
//! [`Role::server_name`]) and `localhost` and the address 127.0.0.1, and can
//! act as both client and server, because every party both dials and serves.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;
use x509_parser::time::ASN1Time;

use crate::error::TlsError;
use crate::role::{NODE_URI_PREFIX, ROLE_URI_PREFIX, Role, VOTER_URI_PREFIX};

/// File stem of the cluster CA's certificate and key in a cluster directory.
pub const CA_NAME: &str = "ca";

/// Lifetime of every certificate this module issues.
const VALIDITY: Duration = Duration::from_secs(3653 * 24 * 60 * 60);
/// Backdating of `not_before`, so that a peer whose clock runs a little behind accepts a fresh certificate.
const CLOCK_SKEW: Duration = Duration::from_secs(60 * 60);

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TlsError + use<> {
    let path = path.to_owned();
    move |error| TlsError::Io { action, path, error }
}

fn gen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> TlsError {
    let what = what.into();
    move |error| TlsError::Generate { what, error }
}

/// The certificate and key paths of identity `name` in cluster directory `dir`.
pub fn identity_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")))
}

/// Checks that `name` is safe as a file stem inside the cluster directory.
fn check_name(name: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name != CA_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(TlsError::InvalidName { name: name.to_owned() }) }
}

/// Parameters with the validity window of a new certificate: from an hour ago to ten years from now.
fn params_valid_from_now() -> Result<CertificateParams, TlsError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| TlsError::Clock(e.to_string()))?;
    let secs = |d: Duration| i64::try_from(d.as_secs()).map_err(|e| TlsError::Clock(e.to_string()));
    let not_before = secs(now.saturating_sub(CLOCK_SKEW))?;
    let not_after = secs(now.saturating_add(VALIDITY))?;
    let time =
        |s: i64| ASN1Time::from_timestamp(s).map(|t| t.to_datetime()).map_err(|e| TlsError::Clock(e.to_string()));
    let mut params = CertificateParams::default();
    params.not_before = time(not_before)?;
    params.not_after = time(not_after)?;
    Ok(params)
}

/// Parameters of the cluster CA certificate.
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = params_valid_from_now()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "granary");
    dn.push(DnType::CommonName, "granary cluster CA");
    params.distinguished_name = dn;
    // The CA signs leaves only; it never signs another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

/// Parameters of a leaf certificate for `role`, issued to `name`.
#[cfg(test)]
fn leaf_params(role: Role, name: &str) -> Result<CertificateParams, TlsError> {
    leaf_params_for(role, name, None)
}

fn leaf_params_for(role: Role, name: &str, node_id: Option<u64>) -> Result<CertificateParams, TlsError> {
    let mut params = params_valid_from_now()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "granary");
    dn.push(DnType::CommonName, format!("granary {role} {name}"));
    params.distinguished_name = dn;
    let ia5 = |s: String| Ia5String::try_from(s).map_err(gen_err(format!("the subject names of {name}")));
    params.subject_alt_names = vec![
        SanType::URI(ia5(role.uri())?),
        SanType::DnsName(ia5(role.server_name().to_owned())?),
        SanType::DnsName(ia5("localhost".to_owned())?),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    if let Some(id) = node_id {
        let prefix = match role {
            Role::Node => NODE_URI_PREFIX,
            Role::Coordinator => VOTER_URI_PREFIX,
            other => return Err(TlsError::NodeIdForRole(other)),
        };
        params.subject_alt_names.push(SanType::URI(ia5(format!("{prefix}{id}"))?));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Every party both dials out and serves.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// Creates `path` with `contents`, failing if it exists. `secret` files get mode 0600.
fn write_new(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = opts.open(path).map_err(|error| {
        if error.kind() == io::ErrorKind::AlreadyExists {
            TlsError::AlreadyExists { path: path.to_owned() }
        } else {
            TlsError::Io { action: "creating", path: path.to_owned(), error }
        }
    })?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(io_err("writing", path))
}

fn refuse_existing(paths: &[&Path]) -> Result<(), TlsError> {
    for path in paths {
        // symlink_metadata so that a dangling link also counts as "exists" (create_new would fail on it anyway).
        if fs::symlink_metadata(path).is_ok() {
            return Err(TlsError::AlreadyExists { path: path.to_path_buf() });
        }
    }
    Ok(())
}

/// Generates a key and a `role` certificate for `name` signed by `issuer`, and writes both. Returns (cert, key).
fn write_leaf(
    dir: &Path,
    role: Role,
    name: &str,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    write_leaf_for(dir, role, name, None, issuer)
}

fn write_leaf_for(
    dir: &Path,
    role: Role,
    name: &str,
    node_id: Option<u64>,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let (cert_path, key_path) = identity_paths(dir, name);
    refuse_existing(&[&cert_path, &key_path])?;
    let key = KeyPair::generate().map_err(gen_err(format!("the key of {name}")))?;
    let cert = leaf_params_for(role, name, node_id)?
        .signed_by(&key, issuer)
        .map_err(gen_err(format!("the certificate of {name}")))?;
    // The key first: a certificate without its key is useless, a key without its certificate is harmless.
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    Ok((cert_path, key_path))
}

/// Creates `dir` (if missing), a new cluster CA (`ca.pem`, `ca.key`) and one certificate per role named after the role
/// (`coordinator.pem`/`.key`, `node.pem`/`.key`, `trainer.pem`/`.key`, `admin.pem`/`.key`).
///
/// Refuses if `dir/ca.key` or any of the other files already exists. Returns the paths written, CA first. Key files
/// are written with mode 0600.
pub fn init_cluster(dir: &Path) -> Result<Vec<PathBuf>, TlsError> {
    fs::create_dir_all(dir).map_err(io_err("creating directory", dir))?;
    let (ca_cert_path, ca_key_path) = identity_paths(dir, CA_NAME);
    let mut targets = vec![ca_key_path.clone(), ca_cert_path.clone()];
    for role in Role::ALL {
        let (c, k) = identity_paths(dir, role.as_str());
        targets.extend([k, c]);
    }
    refuse_existing(&targets.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;

    let issuer = create_ca(&ca_cert_path, &ca_key_path)?;

    let mut written = vec![ca_cert_path, ca_key_path];
    for role in Role::ALL {
        let (c, k) = write_leaf(dir, role, role.as_str(), &issuer)?;
        written.extend([c, k]);
    }
    tracing::info!(dir = %dir.display(), "created cluster CA and role certificates");
    Ok(written)
}

/// Writes a new CA certificate and key; returns the issuer they make.
fn create_ca(ca_cert_path: &Path, ca_key_path: &Path) -> Result<Issuer<'static, KeyPair>, TlsError> {
    let ca_key = KeyPair::generate().map_err(gen_err("the CA key"))?;
    let params = ca_params()?;
    let ca_cert = params.self_signed(&ca_key).map_err(gen_err("the CA certificate"))?;
    // ca.key is created first and with create_new, so two concurrent inits cannot both succeed.
    write_new(ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
    write_new(ca_cert_path, ca_cert.pem().as_bytes(), false)?;
    Ok(Issuer::new(params, ca_key))
}

/// The folder of [`init_split`] that holds the CA's certificate and key (keep it offline).
pub const CA_FOLDER: &str = "ca";
/// The folder of [`init_split`] that holds the admin identity (the operator's).
pub const ADMIN_FOLDER: &str = "admin";
/// The folder of [`init_split`] that holds one folder per host identity (`node-3/`, `coordinator-1/`,
/// `trainer/`): each host is given its own, as `--certs` or `certs =`.
pub const HOSTS_FOLDER: &str = "hosts";

/// What [`init_split`] issues besides the CA and the admin identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitPlan {
    /// `node-1` .. `node-N`, each bound to its node id.
    pub nodes: u64,
    /// `coordinator-1` .. `coordinator-M`, each bound to its voter id.
    pub voters: u64,
    /// Also the shared, unbound `node` and `coordinator` identities (any holder may register as any node, or vote
    /// as any voter where the coordinators allow unbound certificates): only when asked.
    pub unbound: bool,
}

/// Creates a cluster's certificates in `out`, one folder per identity, so that no host holds a key it does not
/// need: `ca/` (the CA's certificate and key: keep it off the hosts; `certs issue` signs with it), `admin/` (the
/// admin certificate and key with the CA certificate: the operator's), and in `hosts/` one folder per host
/// identity, each with the CA certificate and that identity's certificate and key and nothing else: `node-1/` ..
/// `node-N/` (bound to node ids), `coordinator-1/` .. `coordinator-M/` (bound to voter ids), `trainer/`, and only
/// with [`SplitPlan::unbound`] the shared `node/` and `coordinator/`. Refuses if `out/ca/ca.key` or any file it
/// would write exists. Returns the paths written, the CA first.
pub fn init_split(out: &Path, plan: SplitPlan) -> Result<Vec<PathBuf>, TlsError> {
    let ca = out.join(CA_FOLDER);
    let admin = out.join(ADMIN_FOLDER);
    let hosts = out.join(HOSTS_FOLDER);
    fs::create_dir_all(&ca).map_err(io_err("creating directory", &ca))?;
    let (ca_cert_path, ca_key_path) = identity_paths(&ca, CA_NAME);
    let mut names: Vec<(Role, String, Option<u64>)> = vec![(Role::Trainer, Role::Trainer.as_str().to_string(), None)];
    if plan.unbound {
        names.extend([Role::Coordinator, Role::Node].iter().map(|r| (*r, r.as_str().to_string(), None)));
    }
    names.extend((1..=plan.nodes).map(|id| (Role::Node, format!("node-{id}"), Some(id))));
    names.extend((1..=plan.voters).map(|id| (Role::Coordinator, format!("coordinator-{id}"), Some(id))));
    let mut targets = vec![ca_key_path.clone(), ca_cert_path.clone()];
    let (admin_cert, admin_key) = identity_paths(&admin, Role::Admin.as_str());
    targets.extend([admin_cert, admin_key, identity_paths(&admin, CA_NAME).0]);
    for (_, name, _) in &names {
        let folder = hosts.join(name);
        let (c, k) = identity_paths(&folder, name);
        targets.extend([c, k, identity_paths(&folder, CA_NAME).0]);
    }
    refuse_existing(&targets.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    create_ca(&ca_cert_path, &ca_key_path)?;
    let mut written = vec![ca_cert_path, ca_key_path];
    let (c, k) = issue_from(&ca, &admin, Role::Admin, Role::Admin.as_str(), None)?;
    written.extend([admin.join(format!("{CA_NAME}.pem")), c, k]);
    for (role, name, id) in names {
        let folder = hosts.join(&name);
        let (c, k) = issue_from(&ca, &folder, role, &name, id)?;
        written.extend([folder.join(format!("{CA_NAME}.pem")), c, k]);
    }
    tracing::info!(dir = %out.display(), "created a cluster CA, the admin identity and one folder per host identity");
    Ok(written)
}

/// The identities in folder `dir`: the stems of its `*.key` files other than the CA's, sorted.
pub fn identities_in(dir: &Path) -> Result<Vec<String>, TlsError> {
    let entries = fs::read_dir(dir).map_err(io_err("listing", dir))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("listing", dir))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".key")) else { continue };
        if stem != CA_NAME && !stem.is_empty() {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Which identity of folder `dir` to load: `name` if given; else `default` if the folder holds it (the
/// all-in-one folder of [`init_cluster`]); else the folder's one identity (a folder of [`init_split`]).
pub fn identity_name(dir: &Path, name: Option<&str>, default: &str) -> Result<String, TlsError> {
    if let Some(name) = name {
        return Ok(name.to_owned());
    }
    if identity_paths(dir, default).1.exists() {
        return Ok(default.to_owned());
    }
    let mut found = identities_in(dir)?;
    match found.len() {
        1 => Ok(found.remove(0)),
        _ => Err(TlsError::WhichIdentity { dir: dir.to_owned(), found }),
    }
}

/// Issues `dir/{name}.pem` and `dir/{name}.key` for `role`, signed by the CA in `dir/ca.pem` and `dir/ca.key`.
///
/// Refuses to overwrite either file, and refuses names that are not plain file stems (or are `ca`). Returns
/// (certificate path, key path).
pub fn issue(dir: &Path, role: Role, name: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    issue_bound(dir, role, name, None)
}

/// [`issue`], with an id bound into the certificate: a node id (role node, `urn:granary:node:<id>`: the coordinator
/// then lets it register and heartbeat only as that node, and peers take chunks from it only as that node) or a voter
/// id (role coordinator, `urn:granary:voter:<id>`: Raft accepts it only as that voter).
pub fn issue_bound(dir: &Path, role: Role, name: &str, node_id: Option<u64>) -> Result<(PathBuf, PathBuf), TlsError> {
    issue_from(dir, dir, role, name, node_id)
}

/// [`issue_bound`] with the CA (`ca.pem`, `ca.key`) in folder `ca` and the new certificate written into `dir`
/// (created if missing), with a copy of `ca.pem` there when it has none, so `dir` is a whole identity folder.
/// Refuses a `dir` (other than `ca`) that already holds another identity's key: one key per folder, so that the
/// folder a host is given lets it be only that identity.
pub fn issue_from(
    ca: &Path,
    dir: &Path,
    role: Role,
    name: &str,
    node_id: Option<u64>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    if node_id.is_some() && !matches!(role, Role::Node | Role::Coordinator) {
        return Err(TlsError::NodeIdForRole(role));
    }
    check_name(name)?;
    if ca != dir {
        // An identity folder is what one host is given: it holds one key.
        if dir.exists() {
            let others: Vec<String> = identities_in(dir)?.into_iter().filter(|n| n != name).collect();
            if !others.is_empty() {
                return Err(TlsError::FolderHoldsIdentity { dir: dir.to_owned(), found: others });
            }
        }
        fs::create_dir_all(dir).map_err(io_err("creating directory", dir))?;
        let (ca_pem, _) = identity_paths(ca, CA_NAME);
        let (copy, _) = identity_paths(dir, CA_NAME);
        if !copy.exists() {
            let pem = read_file(&ca_pem)?;
            write_new(&copy, &pem, false)?;
        }
    }
    let (ca_cert_path, ca_key_path) = identity_paths(ca, CA_NAME);
    let ca_certs = read_certs(&ca_cert_path)?;
    let ca_key_der = read_key(&ca_key_path)?;
    let ca_key = KeyPair::try_from(&ca_key_der)
        .map_err(|e| TlsError::BadKey { path: ca_key_path.clone(), error: e.to_string() })?;
    // ca.pem may hold several CAs (during a rotation); sign with the one whose key we hold.
    let ca_cert = ca_certs
        .iter()
        .find(|c| spki_of(c).is_some_and(|spki| spki == ca_key.subject_public_key_info()))
        .ok_or_else(|| TlsError::KeyMismatch { cert: ca_cert_path.clone(), key: ca_key_path.clone() })?;
    let issuer = Issuer::from_ca_cert_der(ca_cert, ca_key).map_err(|e| TlsError::CertificateFile {
        path: ca_cert_path.clone(),
        error: Box::new(TlsError::MalformedCertificate(e.to_string())),
    })?;
    let written = write_leaf_for(dir, role, name, node_id, &issuer)?;
    tracing::info!(dir = %dir.display(), %role, name, ?node_id, "issued certificate");
    Ok(written)
}

/// The DER SubjectPublicKeyInfo of a certificate, or None if it does not parse.
fn spki_of(der: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.tbs_certificate.subject_pki.raw.to_vec())
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(io_err("reading", path))
}

/// Every PEM certificate in `path` (at least one).
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem { path: path.to_owned(), error })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificateInFile { path: path.to_owned() });
    }
    Ok(certs)
}

/// The first PEM private key in `path`.
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKeyInFile { path: path.to_owned() },
        error => TlsError::Pem { path: path.to_owned(), error },
    })
}

/// The role a DER certificate carries in its `urn:granary:role:<role>` subject-alternative name.
///
/// Fails if the bytes are not a certificate, if no role is named, if the role is unknown, or if two different roles
/// are named.
pub fn role_of_cert(der: &[u8]) -> Result<Role, TlsError> {
    let mut found: Option<Role> = None;
    for uri in san_uris(der)? {
        let Some(role) = uri.strip_prefix(ROLE_URI_PREFIX) else { continue };
        let role: Role = role.parse()?;
        match found {
            Some(first) if first != role => return Err(TlsError::ConflictingRoles { first, second: role }),
            _ => found = Some(role),
        }
    }
    found.ok_or(TlsError::NoRole)
}

/// The URI subject-alternative names of a DER certificate.
fn san_uris(der: &[u8]) -> Result<Vec<String>, TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::MalformedCertificate(e.to_string()))?;
    let san = cert.subject_alternative_name().map_err(|e| TlsError::MalformedCertificate(e.to_string()))?;
    Ok(san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect())
}

/// The node id a DER certificate is bound to (`urn:granary:node:<id>`), if any.
pub fn node_id_of_cert(der: &[u8]) -> Result<Option<u64>, TlsError> {
    bound_id_of_cert(der, NODE_URI_PREFIX, "node")
}

/// The voter id a DER certificate is bound to (`urn:granary:voter:<id>`), if any.
pub fn voter_id_of_cert(der: &[u8]) -> Result<Option<u64>, TlsError> {
    bound_id_of_cert(der, VOTER_URI_PREFIX, "voter")
}

fn bound_id_of_cert(der: &[u8], prefix: &str, what: &str) -> Result<Option<u64>, TlsError> {
    let mut found: Option<u64> = None;
    for uri in san_uris(der)? {
        let Some(id) = uri.strip_prefix(prefix) else { continue };
        let id: u64 = id.parse().map_err(|_| TlsError::MalformedCertificate(format!("bad {what} id in {uri:?}")))?;
        if let Some(first) = found
            && first != id
        {
            return Err(TlsError::MalformedCertificate(format!("names two {what} ids, {first} and {id}")));
        }
        found = Some(id);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain_file_stems() {
        for good in ["node-1", "trainer.a_b", "N0"] {
            check_name(good).unwrap();
        }
        for bad in ["", "ca", ".hidden", "a/b", "..", "a b", "ü", &"x".repeat(65)] {
            assert!(matches!(check_name(bad), Err(TlsError::InvalidName { .. })), "{bad:?} accepted");
        }
    }

    fn cert_with_sans(uris: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names =
            uris.iter().map(|u| SanType::URI(Ia5String::try_from(*u).unwrap())).collect::<Vec<_>>();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn role_of_cert_reads_the_role_uri() {
        assert_eq!(role_of_cert(&cert_with_sans(&["urn:granary:role:trainer"])).unwrap(), Role::Trainer);
        assert_eq!(
            role_of_cert(&cert_with_sans(&[
                "https://example.invalid",
                "urn:granary:role:node",
                "urn:granary:role:node"
            ]))
            .unwrap(),
            Role::Node
        );
        assert!(matches!(role_of_cert(&cert_with_sans(&[])), Err(TlsError::NoRole)));
        assert!(matches!(role_of_cert(&cert_with_sans(&["urn:granary:role:root"])), Err(TlsError::UnknownRole(_))));
        assert!(matches!(
            role_of_cert(&cert_with_sans(&["urn:granary:role:node", "urn:granary:role:admin"])),
            Err(TlsError::ConflictingRoles { first: Role::Node, second: Role::Admin })
        ));
        assert!(matches!(role_of_cert(b"not a certificate"), Err(TlsError::MalformedCertificate(_))));
        assert!(matches!(role_of_cert(&[]), Err(TlsError::MalformedCertificate(_))));
    }

    #[test]
    fn leaf_certificates_carry_role_names_and_usages() {
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params().unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let der = leaf_params(Role::Coordinator, "c1").unwrap().signed_by(&key, &issuer).unwrap().der().to_vec();
        assert_eq!(role_of_cert(&der).unwrap(), Role::Coordinator);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let names = &cert.subject_alternative_name().unwrap().unwrap().value.general_names;
        assert_eq!(
            names,
            &[
                GeneralName::URI("urn:granary:role:coordinator"),
                GeneralName::DNSName("granary-coordinator"),
                GeneralName::DNSName("localhost"),
                GeneralName::IPAddress(&[127, 0, 0, 1]),
            ]
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert!(!cert.is_ca());
        let years = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) / (365 * 86400);
        assert_eq!(years, 10);
    }
}
