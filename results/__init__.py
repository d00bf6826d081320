"""Results: run records and where they live (``records``, ``layout``), the long-format
table, statistics, figures and the Markdown report; ``paper/`` holds the verdicts on the
paper's claims drawn from the reference records."""
from .layout import record_path, workdir_for
from .records import STATUSES, load_records, read_record, records_frame, write_record
