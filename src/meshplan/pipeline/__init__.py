"""Pipeline parallelism: how layers map to stages, schedules as action lists, and their simulation."""
