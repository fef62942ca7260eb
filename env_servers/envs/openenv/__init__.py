"""OpenEnv environments in our protocol (`adapter`, ids ``openenv:...``) and our envs as OpenEnv servers (`serve`)."""
