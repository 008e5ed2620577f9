"""Small programs the tests run in Dynamo 1.6.1's own environment (never imported by the planner's)."""
