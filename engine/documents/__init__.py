"""Documents attached to chats: conversion, index, prompt rendering."""
