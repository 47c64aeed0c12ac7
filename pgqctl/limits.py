"""The sizes pgqctl accepts in a job and in the names an operator gives.

One place for the numbers that `enqueue`, `pause`, `schedule` and the
worker check, and that the README states. Names are bounded so that every
index holding them stays far below PostgreSQL's btree limit (about 2,700
bytes a row: a queue and a unique key of 4-byte characters at these limits
take 1,536); a payload, so that one row cannot make the worker or a read
command load hundreds of megabytes.
"""

from __future__ import annotations

# A job's payload, as JSON text in UTF-8. The worker and `enqueue` take
# --max-payload-bytes to raise it.
MAX_PAYLOAD_BYTES = 1024 * 1024
# Queue, kind and schedule names, in characters.
MAX_NAME_CHARS = 128
# A unique key, in characters.
MAX_KEY_CHARS = 256
