"""Clients that talk to the router: the benchmark client and the accuracy gate."""
