# The administrator's day as docs/ tells it: the pages' claims, messages and commands.
