"""The job's fence, as every ddprun message starts (errors.h: "[job <id> round <n>]")."""
import os


def fence():
    """"[job <id> round <n>]" from the worker's environment ("?" where unset)."""
    return "[job %s round %s]" % (os.environ.get("DDPRUN_JOB_ID", os.environ.get(
        "TORCHELASTIC_RUN_ID", "?")), os.environ.get("DDPRUN_ROUND", "?"))
