"""What a run shows and hands on: progress, tracking, the report and its figures, trace export, statistics."""
