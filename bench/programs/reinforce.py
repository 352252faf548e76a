"""pytorch/examples' ``reinforcement_learning/reinforce.py``: REINFORCE on CartPole-v1.

The same policy (4-128-2: Linear, Dropout(0.6), ReLU, Linear, softmax), the same
action selection (``Categorical``, one forward per environment step), the same update
(discounted returns normalised, ``-log_prob * R`` summed, one backward and one Adam
step per episode). gym is not installed here: the environment is ``cartpole.CartPole``,
a re-implementation of gym's CartPole-v1. The example's module-level state is held by
:class:`Reinforce`, so that bench/small_ops.py can run its episodes one at a time.

    python bench/programs/reinforce.py --seconds 40     # episodes finished in 40 s
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

try:
    from cartpole import CartPole
except ImportError:  # imported as bench.programs.reinforce
    from .cartpole import CartPole


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

        self.saved_log_probs: list[torch.Tensor] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


class Reinforce:
    """The example's globals (env, policy, optimizer) and its functions."""

    def __init__(self, seed: int = 543, gamma: float = 0.99) -> None:
        self.gamma = gamma
        self.env = CartPole()
        self.env.reset(seed=seed)
        torch.manual_seed(seed)
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.eps = np.finfo(np.float32).eps.item()
        self.running_reward = 10.0

    def select_action(self, state: np.ndarray) -> int:
        state_t = torch.from_numpy(state).float().unsqueeze(0)
        probs = self.policy(state_t)
        m = Categorical(probs)
        action = m.sample()
        self.policy.saved_log_probs.append(m.log_prob(action))
        return int(action.item())

    def finish_episode(self) -> None:
        policy = self.policy
        R = 0.0
        policy_loss = []
        returns_q: deque[float] = deque()
        for r in policy.rewards[::-1]:
            R = r + self.gamma * R
            returns_q.appendleft(R)
        returns = torch.tensor(returns_q)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        for log_prob, Rt in zip(policy.saved_log_probs, returns, strict=True):
            policy_loss.append(-log_prob * Rt)
        self.optimizer.zero_grad()
        loss = torch.cat(policy_loss).sum()
        loss.backward()
        self.optimizer.step()
        del policy.rewards[:]
        del policy.saved_log_probs[:]

    def episode(self) -> int:
        """One episode and its update; returns its environment steps."""
        state, _ = self.env.reset()
        ep_reward = 0.0
        t = 0
        for t in range(1, 10000):  # noqa: B007  (Don't infinite loop while learning)
            action = self.select_action(state)
            state, reward, terminated, truncated, _ = self.env.step(action)
            self.policy.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        self.running_reward = 0.05 * ep_reward + (1 - 0.05) * self.running_reward
        self.finish_episode()
        return t


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch REINFORCE example")
    parser.add_argument("--gamma", type=float, default=0.99, metavar="G")
    parser.add_argument("--seed", type=int, default=543, metavar="N")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = Reinforce(args.seed, args.gamma)
    started = time.perf_counter()
    for i_episode in count(1):
        ep_steps = run.episode()
        if i_episode % args.log_interval == 0:
            print(
                f"Episode {i_episode}\tLast reward: {ep_steps:.2f}\t"
                f"Average reward: {run.running_reward:.2f}"
            )
        if run.running_reward > run.env.reward_threshold:
            print(
                f"Solved! Running reward is now {run.running_reward} and "
                f"the last episode runs to {ep_steps} time steps!"
            )
            break
        if args.seconds and time.perf_counter() - started > args.seconds:
            print(f"{i_episode} episodes in {args.seconds:.0f} s")
            break


if __name__ == "__main__":
    main()
