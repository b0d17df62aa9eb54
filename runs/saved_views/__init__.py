"""Saved views of the runs list: a name for a set of filters, columns and a sort, kept per user and
shared with a project's members when asked."""
