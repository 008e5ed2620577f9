"""A fleet of deployments under one GPU budget: each deployment's demand, and the arbitration between them."""
