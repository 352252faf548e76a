"""pytorch/examples' ``reinforcement_learning/actor_critic.py``: actor-critic on CartPole-v1.

The same model (a shared Linear(4, 128) and ReLU, an action head with softmax and a
value head), the same action selection (one forward per environment step), the same
update (per step of the episode: the advantage read with ``value.item()``, a policy
loss and a ``smooth_l1_loss`` against a one-element tensor; stacked, summed, one
backward and one Adam step per episode): a per-sample loop of tiny ops on both the
forward and the update side. The environment is ``cartpole.CartPole`` (gym is not
installed here). :class:`ActorCritic` holds the example's globals.

    python bench/programs/actor_critic.py --seconds 40
"""

from __future__ import annotations

import argparse
import time
from collections import namedtuple
from itertools import count

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

try:
    from cartpole import CartPole
except ImportError:  # imported as bench.programs.actor_critic
    from .cartpole import CartPole

SavedAction = namedtuple("SavedAction", ["log_prob", "value"])


class Policy(nn.Module):
    """Implements both actor and critic in one model."""

    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)  # actor's layer
        self.value_head = nn.Linear(128, 1)  # critic's layer
        self.saved_actions: list[SavedAction] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.affine1(x))
        action_prob = F.softmax(self.action_head(x), dim=-1)
        state_values = self.value_head(x)
        return action_prob, state_values


class ActorCritic:
    """The example's globals (env, model, optimizer) and its functions."""

    def __init__(self, seed: int = 543, gamma: float = 0.99) -> None:
        self.gamma = gamma
        self.env = CartPole()
        self.env.reset(seed=seed)
        torch.manual_seed(seed)
        self.model = Policy()
        self.optimizer = optim.Adam(self.model.parameters(), lr=3e-2)
        self.eps = np.finfo(np.float32).eps.item()
        self.running_reward = 10.0

    def select_action(self, state: np.ndarray) -> int:
        state_t = torch.from_numpy(state).float()
        probs, state_value = self.model(state_t)
        m = Categorical(probs)
        action = m.sample()
        self.model.saved_actions.append(SavedAction(m.log_prob(action), state_value))
        return int(action.item())

    def finish_episode(self) -> None:
        model = self.model
        R = 0.0
        saved_actions = model.saved_actions
        policy_losses = []
        value_losses = []
        returns_l: list[float] = []
        for r in model.rewards[::-1]:
            R = r + self.gamma * R
            returns_l.insert(0, R)
        returns = torch.tensor(returns_l)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        for (log_prob, value), Rt in zip(saved_actions, returns, strict=True):
            advantage = Rt - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([Rt])))
        self.optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        loss.backward()
        self.optimizer.step()
        del model.rewards[:]
        del model.saved_actions[:]

    def episode(self) -> int:
        """One episode and its update; returns its environment steps."""
        state, _ = self.env.reset()
        ep_reward = 0.0
        t = 0
        for t in range(1, 10000):  # noqa: B007  (t is returned)
            action = self.select_action(state)
            state, reward, terminated, truncated, _ = self.env.step(action)
            self.model.rewards.append(reward)
            ep_reward += reward
            if terminated or truncated:
                break
        self.running_reward = 0.05 * ep_reward + (1 - 0.05) * self.running_reward
        self.finish_episode()
        return t


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch actor-critic example")
    parser.add_argument("--gamma", type=float, default=0.99, metavar="G")
    parser.add_argument("--seed", type=int, default=543, metavar="N")
    parser.add_argument("--log-interval", type=int, default=10, metavar="N")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = ActorCritic(args.seed, args.gamma)
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
