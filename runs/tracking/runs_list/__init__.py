"""The runs list: its query parameters read and checked (run_filters), its search box and setting filters
(run_search), and the page of rows they select (run_table)."""
