"""Reports: one data object (RunReport), rendered to JSON, Markdown, JUnit and HTML."""
