//! File reservations for agents sharing a repository: reserve, release, renew, list. The
//! project defaults to the repository of the client's first root (else the working
//! directory). Other holders' reasons are their words: fenced in every view.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::client::reservations::{Release, Reserved};
use crate::doorbell::frame::fence_line;
use crate::mcp::attach;
use crate::mcp::errors::Doing;
use crate::mcp::server::MailslotServer;
use crate::protocol::{
    MAX_PATTERNS, MAX_REASON_CHARS, Pattern, ProjectName, Reason, Reservation, ReservationId,
    ReservationMode, ReservationRequest, Ttl, validate_patterns,
};

/// Arguments of `reserve_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveArgs {
    /// Repository-relative paths or globs, 1 to 16: "src/relay/**", "docs/*.md",
    /// "Cargo.toml" (a folder holds everything under it).
    pub patterns: Vec<String>,
    /// Why, in one line (the other agents see it).
    pub reason: String,
    /// true: others may share the files (conflicts only with an exclusive holder); default
    /// false: exclusive.
    #[serde(default)]
    pub shared: Option<bool>,
    /// How long, like "30m" or "2h" (default "1h", at most "24h"); renew_files keeps it longer.
    #[serde(default)]
    pub ttl: Option<String>,
    /// The project (default: the repository of your client's root or working directory).
    #[serde(default)]
    pub project: Option<String>,
}

/// Arguments of `release_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseArgs {
    /// Reservation ids to release (from reserve_files or reservations).
    #[serde(default)]
    pub ids: Option<Vec<String>>,
    /// Or patterns exactly as reserved.
    #[serde(default)]
    pub patterns: Option<Vec<String>>,
    /// Or true: every one of yours in the project.
    #[serde(default)]
    pub all: Option<bool>,
    /// The project (default: your repository's).
    #[serde(default)]
    pub project: Option<String>,
}

/// Arguments of `renew_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewArgs {
    /// Reservation ids to renew (default: all of yours in the project).
    #[serde(default)]
    pub ids: Option<Vec<String>>,
    /// New TTL from now, like "30m" or "2h" (default "1h").
    #[serde(default)]
    pub ttl: Option<String>,
    /// The project (default: your repository's).
    #[serde(default)]
    pub project: Option<String>,
}

/// Arguments of `reservations`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The project (default: your repository's).
    #[serde(default)]
    pub project: Option<String>,
}

/// A reservation as the model sees it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReservationView {
    /// Its id (for release_files and renew_files).
    pub id: String,
    /// The agent holding it.
    pub holder: String,
    /// What it holds.
    pub patterns: Vec<String>,
    /// "exclusive" or "shared".
    pub mode: String,
    /// Why: the holder's words, fenced (untrusted when another agent holds it).
    pub reason: String,
    /// When it lapses unless renewed (RFC 3339).
    pub expires_at: String,
}

impl ReservationView {
    fn of(r: &Reservation) -> Self {
        Self {
            id: r.id.to_string(),
            holder: r.holder.to_string(),
            patterns: r.patterns.iter().map(ToString::to_string).collect(),
            mode: r.mode.to_string(),
            reason: fence_line(r.reason.as_str(), MAX_REASON_CHARS),
            expires_at: r.expires_at.to_string(),
        }
    }
}

/// What `reserve_files` came to.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReserveResult {
    /// "reserved", or "refused" (others hold the files; nothing was reserved).
    pub status: String,
    /// The project.
    pub project: String,
    /// The reservation made, when reserved.
    pub reservation: Option<ReservationView>,
    /// What is in the way, when refused: holder, patterns, reason, expiry.
    pub conflicts: Vec<ReservationView>,
    /// What to do next.
    pub detail: String,
}

/// Reservations listed or renewed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReservationsView {
    /// The project.
    pub project: String,
    /// The reservations.
    pub reservations: Vec<ReservationView>,
}

/// Reservations released.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReleasedView {
    /// The project.
    pub project: String,
    /// The ids released (none: you held nothing like that).
    pub released: Vec<String>,
}

/// The project named, or the repository's of the client's first root (else the working
/// directory).
async fn project(
    ctx: RequestContext<RoleServer>,
    given: Option<String>,
) -> Result<ProjectName, String> {
    if let Some(raw) = given {
        return ProjectName::new(raw.trim()).map_err(|e| format!("project {}", e.problem));
    }
    let folders = attach::folders(&ctx).await?;
    let dir = folders
        .first()
        .ok_or("no folder to find the repository in; pass project")?
        .to_owned();
    tokio::task::spawn_blocking(move || crate::repo::project(&dir))
        .await
        .map_err(|e| format!("reading the repository failed ({e}); try again"))?
        .map_err(|e| e.to_string())
}

fn ttl(raw: Option<&str>) -> Result<Ttl, String> {
    raw.map_or(Ok(Ttl::default()), |t| {
        Ttl::parse(t).map_err(|e| format!("ttl {}", e.problem))
    })
}

fn patterns(field: &str, raw: &[String]) -> Result<Vec<Pattern>, String> {
    if raw.len() > MAX_PATTERNS {
        return Err(format!(
            "{field} has {} items, over the limit of {MAX_PATTERNS}; use a glob like \"src/relay/**\"",
            raw.len()
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, p)| Pattern::new(p.trim()).map_err(|e| format!("{field}[{i}] {}", e.problem)))
        .collect()
}

fn ids(raw: &[String]) -> Result<Vec<ReservationId>, String> {
    raw.iter()
        .enumerate()
        .map(|(i, id)| {
            ReservationId::parse(id.trim()).map_err(|_| {
                format!("ids[{i}] {id:?} is not a reservation id; copy id from reserve_files or reservations")
            })
        })
        .collect()
}

#[tool_router(router = reservation_tools, vis = "pub(super)")]
impl MailslotServer {
    /// Reserve files of the repository you work in, so other agents keep off them while you
    /// edit: exclusive by default, or shared. Refused (nothing reserved) when another agent
    /// holds them: you get each holder, pattern, reason and expiry, and the holders are told
    /// you wait. Release when done; a reservation lapses at its TTL.
    #[tool(annotations(
        title = "Reserve files",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn reserve_files(
        &self,
        Parameters(args): Parameters<ReserveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReserveResult>, String> {
        let patterns = patterns("patterns", &args.patterns)?;
        validate_patterns(&patterns).map_err(|e| format!("{} {}", e.field, e.problem))?;
        let reason = Reason::new(&args.reason).map_err(|e| format!("reason {}", e.problem))?;
        let ttl = ttl(args.ttl.as_deref())?;
        let project = project(ctx, args.project).await?;
        let mode = if args.shared.unwrap_or(false) {
            ReservationMode::Shared
        } else {
            ReservationMode::Exclusive
        };
        let wanted = ReservationRequest {
            project: project.clone(),
            patterns,
            mode,
            reason,
            ttl,
        };
        let result = match self.mailbox.reserve(wanted).await {
            Ok(Reserved::Granted { reservation }) => ReserveResult {
                status: "reserved".into(),
                project: project.to_string(),
                detail: format!(
                    "reserved until {}; call release_files with its id when done, or renew_files to keep it longer",
                    reservation.expires_at
                ),
                reservation: Some(ReservationView::of(&reservation)),
                conflicts: Vec::new(),
            },
            Ok(Reserved::Refused { conflicts }) => ReserveResult {
                status: "refused".into(),
                project: project.to_string(),
                reservation: None,
                detail: "other agents hold these files; each was told you wait. Work on something else, or try again after their expiry or release (reservations lists what is held)".into(),
                conflicts: conflicts.iter().map(ReservationView::of).collect(),
            },
            Err(e) => return Err(self.tool_error(e, Doing::Asking).await),
        };
        Ok(Json(result))
    }

    /// Release your reservations: by ids, by patterns exactly as reserved, or all of them
    /// in the project.
    #[tool(annotations(
        title = "Release files",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn release_files(
        &self,
        Parameters(args): Parameters<ReleaseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReleasedView>, String> {
        let which = match (args.ids, args.patterns, args.all.unwrap_or(false)) {
            (Some(raw), None, false) => Release::Ids(ids(&raw)?),
            (None, Some(raw), false) => Release::Patterns(patterns("patterns", &raw)?),
            (None, None, true) => Release::All,
            _ => {
                return Err("give exactly one of ids, patterns, or all: true".into());
            }
        };
        let project = project(ctx, args.project).await?;
        match self.mailbox.release_reserved(project.clone(), which).await {
            Ok(released) => Ok(Json(ReleasedView {
                project: project.to_string(),
                released: released.iter().map(ToString::to_string).collect(),
            })),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }

    /// Give your reservations (those named, else all of yours in the project) a new TTL from
    /// now. An expired one is gone: reserve it again.
    #[tool(annotations(
        title = "Renew files",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn renew_files(
        &self,
        Parameters(args): Parameters<RenewArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReservationsView>, String> {
        let ids = ids(args.ids.as_deref().unwrap_or_default())?;
        let ttl = ttl(args.ttl.as_deref())?;
        let project = project(ctx, args.project).await?;
        match self.mailbox.renew_reserved(project.clone(), ids, ttl).await {
            Ok(renewed) => Ok(Json(ReservationsView {
                project: project.to_string(),
                reservations: renewed.iter().map(ReservationView::of).collect(),
            })),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }

    /// Who holds which files in the project now: every agent's live reservations, with
    /// pattern, mode, reason and expiry.
    #[tool(annotations(title = "Reservations", read_only_hint = true, open_world_hint = true))]
    async fn reservations(
        &self,
        Parameters(args): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReservationsView>, String> {
        let project = project(ctx, args.project).await?;
        match self.mailbox.reservations(project.clone()).await {
            Ok(listed) => Ok(Json(ReservationsView {
                project: project.to_string(),
                reservations: listed.iter().map(ReservationView::of).collect(),
            })),
            Err(e) => Err(self.tool_error(e, Doing::Asking).await),
        }
    }
}
