"""Deprecated: tokens and principals live in :mod:`leaseq.access` (this module re-exports them).

Import from :mod:`leaseq.access` instead; these names stay importable from here.
"""

from .access.actions import DEFAULT_READ_PAYLOADS as DEFAULT_READ_PAYLOADS, RIGHTS as RIGHTS, ROLES as ROLES
from .access.principals import Principal as Principal
from .access.tokens import (MAX_SESSION_SECONDS as MAX_SESSION_SECONDS, acheck_token as acheck_token,
                            audit_log as audit_log, averify_token as averify_token, check_token as check_token,
                            create_session as create_session, create_token as create_token,
                            end_session as end_session, hash_token as hash_token, list_tokens as list_tokens,
                            record_action as record_action, revoke_token as revoke_token,
                            revoke_worker_token as revoke_worker_token, session_hash as session_hash,
                            token_check as token_check, token_hashes as token_hashes,
                            token_held_task as token_held_task, token_id_of as token_id_of,
                            verify_session as verify_session, verify_token as verify_token, verifying as verifying,
                            worker_token as worker_token)
from .core.errors import AccessDenied as AccessDenied, RateLimited as RateLimited, Unauthorized as Unauthorized
