"""Reports: traces, figures and HTML pages built from results (no plotting in the engine)."""
