"""Results: run records, the long-format table, figures and the Markdown report."""
from .records import STATUSES, load_records, provenance, read_record, record_path, records_frame, write_record
