"""The run-directory contract: its vocabulary, file names and typed readers/writers."""
