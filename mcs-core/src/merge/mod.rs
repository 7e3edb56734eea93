//! The merge and conflict engine: every cluster's export of one `<namespace>/<name>` in,
//! one ServiceImport and the conditions of every export out (KEP-1645, "Constraints and Conflict Resolution").
//!
//! # Inputs
//!
//! A [`Constituent`] is one cluster's export of one service: the cluster id, the export's
//! `creationTimestamp` (passed in; nothing here reads a clock), its `exportedLabels` and
//! `exportedAnnotations`, and the [`ServiceFacts`] of the local Service, or `None` when no
//! such Service exists. Core Services become facts at this edge with
//! `ServiceFacts::try_from(&Service)`, which returns a typed [`InputError`] naming the
//! Service and the problem (repeated port name or (protocol, port), a port outside
//! `1..=65535`, an unknown protocol, type, `sessionAffinity`, `internalTrafficPolicy`,
//! `trafficDistribution` or IP family). `ExternalName` is not an error: it is a fact.
//!
//! # Rules
//!
//! - **Validity** (KEP-1645). An export whose Service is missing is
//!   `Valid=False/NoService`; an `ExternalName` Service gives
//!   `Valid=False/InvalidServiceType`, and so does a headless one whose export has cluster
//!   selectors (KEP-5939); invalid cluster selectors give
//!   `Valid=False/InvalidClusterSelector`, the message naming the entry and the problem.
//!   None of these contributes anything. The others are
//!   `Valid=True/Valid` and are the constituents. **An import exists iff at least one
//!   export is valid.**
//! - **Precedence** (KEP-1645). Oldest `creationTimestamp` first. **Tie-break**: the
//!   KEP defines none and timestamps have one-second resolution, so exports created at the
//!   same instant are ordered by cluster id, lowest first in byte-wise lexical order (the
//!   order of [`ClusterId`]'s `Ord`). Every cluster computes the same order. The first
//!   export is the *winner*.
//! - **Type.** `ClusterIP`, `NodePort`, `LoadBalancer` give `ClusterSetIP`; `clusterIP:
//!   None` gives `Headless`. A mix is a `TypeConflict` and the winner's type is used.
//! - **Ports.** The union in precedence order, each export's ports in its Service's order.
//!   Ports are matched on name first (no name counts as the name `""`), then on (protocol,
//!   port) with a missing protocol read as TCP; on a collision the earlier export's port
//!   wins, so the result never repeats a name or a (protocol, port) pair. Ports are
//!   compared on name, protocol, port and `appProtocol`: **any difference between the port
//!   sets is a `PortConflict`**, including one cluster having an extra port.
//! - **Routing** (KEP-1645: "traffic to a port SHOULD go only to endpoints in
//!   clusters whose Service exposes that port"). A cluster may receive traffic for a
//!   merged port only when its Service exposes that port (same name, protocol and number;
//!   `appProtocol` is only a hint) **and** can be reached over an IP family the import
//!   publishes: the two share a family, or either states none. [`MergedImport::routes`]
//!   lists those clusters per port. A cluster left out for its families is one in
//!   `IPFamilyConflict` whose backends have none of the import's families (an IPv6-only
//!   Service under an IPv4 import): they are unreachable over every family the import
//!   has, so routing to them would hand out addresses of a family the import does not
//!   have. A dual-stack import keeps routing to a single-stack cluster that has one of
//!   its families. Within a routed cluster, only endpoints of a published family (any,
//!   when none is published) take the traffic ([`MergedImport::admits_family`]). A port
//!   only such clusters expose stays in the union (the port rule does not look at
//!   families) but routes nowhere.
//! - **`sessionAffinity`, `sessionAffinityConfig`, `internalTrafficPolicy`,
//!   `trafficDistribution`**: the winner's values, exactly as its Service has them, each
//!   with its own conflict reason.
//! - **IP families.** The import publishes the winner's `ipFamilies` (none when the
//!   winner's Service states none); the importing agent allocates one IP per family, so
//!   `ips` is always `None` here. A constituent is in **`IPFamilyConflict`** when its
//!   Service states families and lacks one that the import publishes: its backends would be
//!   unreachable over that family (the KEP's MUST). A constituent with an extra family is
//!   not in conflict (every backend stays reachable over every published family), and the
//!   order of families does not matter. We do not intersect the families: a single-stack
//!   newcomer would then withdraw a family from a dual-stack import and break traffic.
//! - **Labels and annotations**: only `exportedLabels` / `exportedAnnotations`, never
//!   `metadata`; the winner's maps are used, and any difference is a `LabelsConflict` /
//!   `AnnotationsConflict`.
//! - **Cluster selectors** (KEP-5939): the winner's ordered `clusterSelectors` (none when
//!   it has none); any other list, the same entries in another order too, is a
//!   `ClusterSelectorsConflict`.
//! - **Conflict** (KEP-1645). A field conflicts when at least one constituent's
//!   value differs from the published one. `Conflict=True` is set on **every** valid
//!   export, with the reasons comma-joined in the order of
//!   [`ConflictReason`](crate::conditions::ConflictReason) and one sentence per field,
//!   e.g. `Conflicting type. Using "ClusterSetIP" from oldest service export in
//!   "cluster-1". 2/5 clusters disagree.` Otherwise it is `False/NoConflicts`. Invalid
//!   exports get `Conflict=False/NoConflicts` too, saying they take no part.
//! - **`status.clusters`**: every valid exporting cluster, sorted by id.
//!
//! # Traffic stability
//!
//! The KEP lets an import stay unchanged when the conflict clears because the oldest
//! export went away (KEP-1645). [`Stability`] makes the choice explicit:
//! [`Stability::Sticky`] (the default) keeps the published properties after their source
//! export goes away until the caller asks for a fresh merge ([`ClusterSetState::refresh`]),
//! while [`Stability::Fresh`] always re-elects the oldest valid export. Both behave the
//! same while the winner stays.
//!
//! # Entry points
//!
//! - [`merge`]: the pure merge of one service.
//! - [`ClusterSetState`]: an incremental index over every service of the ClusterSet, which
//!   takes one constituent at a time and returns a [`Change`].

mod engine;
mod input;
mod state;

pub use engine::{
    ExportConditions, MAX_MESSAGE_LEN, MergeError, MergeOutcome, MergedImport, PortRoute, Source,
    Stability, WinReason, merge,
};
pub use input::{
    Constituent, InputError, MAX_PORT, ServiceFacts, ServiceFactsBuilder, ServiceKind, SpecError,
};
pub use state::{Change, ClusterSetState, ImportChange};

#[cfg(doc)]
use crate::ClusterId;
