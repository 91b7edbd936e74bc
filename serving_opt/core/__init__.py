"""What every part stands on: the gates that decide on an interval, the measuring
process, and rendering reports for people (tables) and pipelines (JSON)."""
