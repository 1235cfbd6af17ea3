"""Talking to the world: HTCondor user logs and ClassAds, SMTP, Slurm commands, drone sites."""
