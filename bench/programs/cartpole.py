"""CartPole-v1 as gym writes it (``gym/envs/classic_control/cartpole.py``), for the
small-op programs beside this file: gym is not installed here.

The same dynamics (Euler integration, tau 0.02), the same termination (the pole past
12 degrees or the cart past 2.4), the same start state (four uniform draws in
[-0.05, 0.05]), reward 1 per step, and CartPole-v1's limit of 500 steps (truncation).
The state is a float32 numpy array, as gym returns it.
"""

from __future__ import annotations

import math

import numpy as np


class CartPole:
    """``env.reset(seed=...)`` and ``env.step(action)`` with gym's (>= 0.26) return values."""

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4
    max_episode_steps = 500
    reward_threshold = 475.0

    def __init__(self) -> None:
        self.np_random = np.random.default_rng()
        self.state = (0.0, 0.0, 0.0, 0.0)
        self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, object]]:
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.state = tuple(float(v) for v in self.np_random.uniform(-0.05, 0.05, size=(4,)))
        self.steps = 0
        return np.array(self.state, dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, object]]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        costheta = math.cos(theta)
        sintheta = math.sin(theta)
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = (x, x_dot, theta, theta_dot)
        self.steps += 1
        terminated = bool(
            x < -self.x_threshold
            or x > self.x_threshold
            or theta < -self.theta_threshold_radians
            or theta > self.theta_threshold_radians
        )
        truncated = self.steps >= self.max_episode_steps
        return np.array(self.state, dtype=np.float32), 1.0, terminated, truncated, {}
