"""Report helpers shared by the notebooks: reading results files, one plotting style,
booktabs tables and LaTeX macros. Nothing here trains or recomputes a result."""
